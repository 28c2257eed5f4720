//! The capture log: one directory per session, one append-only JSONL file of
//! [`CompletionRecord`]s, written and flushed before the harness gets its reply.

pub mod left;
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

/// Append `value` to the JSON-lines file at `path` (made if missing): one write of a short
/// line to an `O_APPEND` file, so concurrent calls do not interleave. The files beside a
/// capture (`upstream-errors.jsonl`, `left-after-capture.jsonl`).
fn append_json_line(path: &std::path::Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    use std::io::Write;
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(&line)
}

/// The longest session id. An id names files and directories (the capture volume, the spool,
/// the trainer's store, a dataset), the longest of them the trainer's temporary
/// `.<id>.json.tmp`, 10 bytes more, and Linux refuses a name past 255 bytes: an id of 250
/// characters failed at its first write, after the session had run.
pub const MAX_SESSION_ID_LEN: usize = 240;

/// A session id is a directory or file name on the capture volume and in a dataset: 1 to
/// [`MAX_SESSION_ID_LEN`] characters of `[A-Za-z0-9._-]`, not starting with a dot.
pub fn valid_session_id(id: &str) -> bool {
    (1..=MAX_SESSION_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !id.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_session_id_names_files_linux_accepts() {
        let longest = "s".repeat(MAX_SESSION_ID_LEN);
        assert!(valid_session_id(&longest));
        assert!(!valid_session_id(&format!("{longest}s")));
        // Every name made from an id: the trainer's temporary one is the longest.
        for name in [
            format!(".{longest}.json.tmp"),
            format!("{longest}.json.tmp"),
            format!("{longest}.jsonl.tmp"),
        ] {
            assert!(name.len() <= 255, "{} bytes", name.len());
        }
        assert!(!valid_session_id(".hidden") && !valid_session_id("a/b") && !valid_session_id(""));
    }
}
