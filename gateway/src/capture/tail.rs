//! A capture read as it grows: each call reads only the lines appended since the last, so a
//! train job's snapshot after every call costs the new call, not the whole session again.
//!
//! A record's bodies (the harness's request, the request sent upstream, the answer) are most
//! of its bytes — a long agent's conversation, over again in every call — and no trajectory
//! reads them, so the records kept here are slimmed to what building one does.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::log::{CaptureReadError, CAPTURE_FILE};
use super::CompletionRecord;

/// The records of one capture read so far, and where the next read starts.
#[derive(Debug, Default)]
pub struct CaptureTail {
    /// Bytes of the file read into `records`: complete lines only.
    offset: u64,
    lines: usize,
    records: Vec<CompletionRecord>,
}

impl CaptureTail {
    /// Read the complete lines appended since the last read. A line still being written (no
    /// newline yet) waits for the next read; a complete line that is not a record is
    /// corruption, as [`super::read_session`] has it.
    pub fn read_more(&mut self, dir: &Path) -> Result<(), CaptureReadError> {
        let path = dir.join(CAPTURE_FILE);
        let io = |source| CaptureReadError::Io {
            path: path.clone(),
            source,
        };
        let mut file = File::open(&path).map_err(io)?;
        if file.metadata().map_err(io)?.len() < self.offset {
            // Shorter than what was read: not the file read before. Read it again whole.
            *self = Self::default();
        }
        file.seek(SeekFrom::Start(self.offset)).map_err(io)?;
        let mut appended = Vec::new();
        file.read_to_end(&mut appended).map_err(io)?;
        let Some(end) = appended.iter().rposition(|&b| b == b'\n') else {
            return Ok(());
        };
        // Kept only once every new line is read: a bad one leaves the tail as it was.
        let mut read = Vec::new();
        let mut lines = self.lines;
        for line in appended[..end].split(|&b| b == b'\n') {
            lines += 1;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let record: CompletionRecord =
                serde_json::from_slice(line).map_err(|source| CaptureReadError::Corrupt {
                    path: path.clone(),
                    line: lines,
                    source,
                })?;
            read.push(record.slimmed());
        }
        if !read.is_empty() {
            // Calls noted as left before their line is read here. One noted later stays as
            // read: a snapshot may already have carried it (the whole read does not).
            super::left::mark(dir, &mut read)?;
        }
        self.records.append(&mut read);
        self.lines = lines;
        self.offset += end as u64 + 1;
        Ok(())
    }

    /// The records read so far, slimmed ([`CompletionRecord::slimmed`]), in the order they
    /// were written.
    pub fn records(&self) -> &[CompletionRecord] {
        &self.records
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::capture::{read_session, CaptureLog, Durability};
    use crate::trajectory::{build_traces, BuildOptions, Builder};

    /// A call with the bodies a harness sends: the conversation, again in every call.
    fn call(seq: u64, cap: u64, sampled: usize) -> CompletionRecord {
        let prompt: Vec<u32> = (0..20 + seq as u32 * 8).collect();
        let conversation = "word ".repeat(200 * (seq as usize + 1));
        CompletionRecord {
            session: "s".into(),
            logprobs: Some(vec![-0.5; sampled]),
            finish_reason: Some(if seq == 2 { "length" } else { "tool_calls" }.into()),
            request: serde_json::json!({"messages": [{"role": "user", "content": conversation}]}),
            normalized_request: serde_json::json!({"max_tokens": cap, "messages": conversation}),
            response: serde_json::json!({"choices": [{"text": conversation}]}),
            ..CompletionRecord::from_tokens(seq, prompt, (0..sampled as u32).collect())
        }
    }

    #[test]
    fn a_capture_read_as_it_grows_builds_what_the_whole_read_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog::open(dir.path(), Durability::Fsync).expect("open");
        let mut tail = CaptureTail::default();
        tail.read_more(dir.path()).expect("an empty capture");
        assert!(tail.records().is_empty());
        for seq in 0..4 {
            // The third call sampled its whole cap: overlong, which only the cap tells.
            let cap = if seq == 2 { 6 } else { 64 };
            log.append(&call(seq, cap, 6)).expect("append");
            tail.read_more(dir.path()).expect("read more");
            let whole = read_session(dir.path()).expect("read");
            assert_eq!(tail.records().len(), whole.records.len());
            for builder in [Builder::PerRequest, Builder::PrefixMerging] {
                let options = BuildOptions {
                    builder,
                    ..Default::default()
                };
                assert_eq!(
                    build_traces(tail.records(), &options),
                    build_traces(&whole.records, &options),
                    "after {} calls, {builder:?}",
                    seq + 1
                );
            }
        }
        let (_, stats) = build_traces(tail.records(), &BuildOptions::default());
        assert_eq!(stats.overlong_turns, 1, "{stats:?}");
        let kept = serde_json::to_vec(tail.records()).expect("json").len();
        let file = std::fs::metadata(dir.path().join(CAPTURE_FILE))
            .expect("capture")
            .len();
        assert!((kept as u64) < file / 4, "slimmed: {kept} of {file} bytes");
    }

    #[test]
    fn a_line_still_being_written_waits_and_a_bad_one_is_corruption() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog::open(dir.path(), Durability::Fsync).expect("open");
        log.append(&call(0, 64, 3)).expect("append");
        drop(log);
        let path = dir.path().join(CAPTURE_FILE);
        let line = serde_json::to_string(&call(1, 64, 3)).expect("json");
        let (head, rest) = line.split_at(line.len() / 2);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        file.write_all(head.as_bytes()).expect("write");
        let mut tail = CaptureTail::default();
        tail.read_more(dir.path()).expect("read");
        assert_eq!(tail.records().len(), 1, "the half-written line waits");
        file.write_all(rest.as_bytes()).expect("write");
        file.write_all(b"\n").expect("write");
        tail.read_more(dir.path()).expect("read");
        assert_eq!(
            tail.records().iter().map(|r| r.seq).collect::<Vec<_>>(),
            [0, 1]
        );
        file.write_all(b"{not a record}\n").expect("write");
        for _ in 0..2 {
            match tail.read_more(dir.path()) {
                Err(CaptureReadError::Corrupt { line, .. }) => assert_eq!(line, 3),
                other => panic!("{other:?}"),
            }
            assert_eq!(tail.records().len(), 2, "a failed read keeps nothing of it");
        }
    }

    #[test]
    fn a_call_noted_as_left_reads_as_abandoned_unless_it_was_read_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog::open(dir.path(), Durability::Write).expect("open");
        let mut tail = CaptureTail::default();
        log.append(&call(0, 64, 3)).expect("append");
        tail.read_more(dir.path()).expect("read");
        log.append(&call(1, 64, 3)).expect("append");
        for seq in [0, 1] {
            crate::capture::left::append(dir.path(), seq, 1).expect("note");
        }
        tail.read_more(dir.path()).expect("read");
        let marks = |records: &[CompletionRecord]| -> Vec<bool> {
            records.iter().map(|r| r.abandoned).collect()
        };
        // The first was read (and may have been in a snapshot) before its note.
        assert_eq!(marks(tail.records()), [false, true]);
        let whole = read_session(dir.path()).expect("read");
        assert_eq!(marks(&whole.records), [true, true]);
    }

    #[test]
    fn a_file_shorter_than_what_was_read_is_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog::open(dir.path(), Durability::Write).expect("open");
        log.append(&call(0, 64, 3)).expect("append");
        log.append(&call(1, 64, 3)).expect("append");
        let mut tail = CaptureTail::default();
        tail.read_more(dir.path()).expect("read");
        drop(log);
        std::fs::remove_file(dir.path().join(CAPTURE_FILE)).expect("remove");
        let mut log = CaptureLog::open(dir.path(), Durability::Write).expect("open");
        log.append(&call(0, 64, 2)).expect("append");
        tail.read_more(dir.path()).expect("read");
        assert_eq!(tail.records().len(), 1);
        assert_eq!(tail.records()[0].completion_token_ids, [0, 1]);
    }
}
