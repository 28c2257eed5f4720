//! Beside a session's capture: the calls whose caller left after their record was written
//! (`left-after-capture.jsonl`), one `{"seq", "atMs"}` line each.
//!
//! A record says `abandoned` when the harness was gone before the answer came. In a train job
//! the reply then waits for the session's snapshot to reach the trainer (up to
//! [`crate::server::snapshot::SNAPSHOT_TIMEOUT`]), and a harness that gives up in that window never sees
//! a reply its record says was acted on. The record is written already and the capture is
//! append-only, so the correction goes here; whoever reads the capture back
//! ([`super::read_session`], [`super::CaptureTail`]) reads those calls as abandoned. A file of
//! its own rather than another kind of line in `completions.jsonl`, so that a v1 reader of the
//! capture still reads it (as it did before: every call answered).

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{CaptureReadError, CompletionRecord};

pub const LEFT_FILE: &str = "left-after-capture.jsonl";

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Left {
    seq: u64,
    at_ms: u64,
}

/// Note that the caller of call `seq` left after its record was written.
pub fn append(dir: &Path, seq: u64, at_ms: u64) -> std::io::Result<()> {
    super::append_json_line(&dir.join(LEFT_FILE), &Left { seq, at_ms })
}

/// Mark the calls among `records` noted so far as abandoned. No file is none noted. A line
/// that does not read (a torn last line) is skipped: the call it would have named reads as it
/// was captured.
pub fn mark(dir: &Path, records: &mut [CompletionRecord]) -> Result<(), CaptureReadError> {
    let path = dir.join(LEFT_FILE);
    let left: BTreeSet<u64> = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .filter_map(|l| serde_json::from_str::<Left>(l).ok())
            .map(|l| l.seq)
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(CaptureReadError::Io { path, source }),
    };
    for record in records {
        record.abandoned |= left.contains(&record.seq);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn noted_calls_read_as_abandoned_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = || -> Vec<CompletionRecord> {
            (0..10)
                .map(|seq| CompletionRecord::from_tokens(seq, vec![1], vec![2]))
                .collect()
        };
        let abandoned = |records: &[CompletionRecord]| -> Vec<u64> {
            records
                .iter()
                .filter(|r| r.abandoned)
                .map(|r| r.seq)
                .collect()
        };
        let mut records = calls();
        mark(dir.path(), &mut records).expect("no file");
        assert!(abandoned(&records).is_empty());
        append(dir.path(), 3, 10).expect("append");
        append(dir.path(), 7, 11).expect("append");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(LEFT_FILE))
            .expect("open");
        file.write_all(br#"{"seq": 9, "at"#).expect("torn");
        let mut records = calls();
        mark(dir.path(), &mut records).expect("read");
        assert_eq!(abandoned(&records), [3, 7]);
    }
}
