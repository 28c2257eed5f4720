//! The capture log: one directory per session, one append-only JSONL file of
//! [`CompletionRecord`]s, written and flushed before the harness gets its reply.

mod log;
mod record;

pub use log::{
    encode_line, find_sessions, read_session, write_meta, CaptureLog, CaptureReadError,
    CaptureWriteError, Durability, SessionCapture, SessionMeta, CAPTURE_FILE, META_FILE, SEAL_FILE,
};
pub use record::{Api, CompletionRecord, CAPTURE_FORMAT_VERSION};
pub mod upstream_errors;
