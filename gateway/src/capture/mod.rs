//! The capture log: one directory per session, one append-only JSONL file of
//! [`CompletionRecord`]s, written and flushed before the harness gets its reply.

mod log;
mod record;
mod tail;

pub use log::{
    encode_line, find_sessions, read_meta, read_session, read_session_slim, write_meta, CaptureLog,
    CaptureReadError, CaptureWriteError, Durability, SessionCapture, SessionMeta, CAPTURE_FILE,
    META_FILE, SEAL_FILE,
};
pub use record::{Api, CompletionRecord, CAPTURE_FORMAT_VERSION};
pub use tail::CaptureTail;
pub mod upstream_errors;

/// A session id is a directory or file name on the capture volume and in a dataset: 1–253
/// characters of `[A-Za-z0-9._-]`, not starting with a dot.
pub fn valid_session_id(id: &str) -> bool {
    (1..=253).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !id.starts_with('.')
}
