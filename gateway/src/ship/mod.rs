//! What happens to a session after the harness is done: the sandbox runner reports the
//! outcome, the gateway builds the trajectory, writes it to an on-disk spool and delivers it
//! to the trainer's ingest endpoint or a dataset directory, retrying until it is accepted.
//!
//! Delivery is at-least-once from the spool and both sinks are idempotent by session id, so a
//! gateway killed at any point ships each trajectory exactly once after its restart.

mod assignment;
pub mod collector;
pub mod dataset_owner;
pub mod shipper;
mod sink;
mod spool;

pub use assignment::{
    Assignment, AssignmentError, Assignments, Delivered, RetryOverride, UpstreamOverride,
};
pub use sink::{deliver, DeliveryError, Failure, Sink};
pub use spool::{
    write_durably, write_jsonl_durably, write_jsonl_durably_seeing, Spool, SpoolEntry, SpoolError,
};
