//! floe's gateway: what sits between an unmodified coding-agent harness and vLLM.
//!
//! - [`capture`]: the per-session capture log — every model call with its exact prompt and
//!   sampled token ids and logprobs (format documented in `docs/capture-format.md`).
//! - [`trajectory`]: sans-IO builders that turn a session's captured completions into
//!   trainer-ready trajectories (`docs/trajectory-format.md`).
//! - [`ship`]: assignments in, trajectories out (spool, trainer or dataset sink).

pub mod bearer;
pub mod capture;
pub mod net_error;
pub mod protocol;
pub mod serve_limited;
pub mod server;
pub mod ship;
pub mod sync;
pub mod trajectory;
