//! Append-only, crash-safe capture files.
//!
//! Each record is one JSON line, handed to the kernel with a single `write_all` (and, with
//! [`Durability::Fsync`], made durable with `fdatasync`) before the caller replies to the
//! harness. A crash can leave at most a torn last line; readers skip it (and count it) instead
//! of failing, so nothing acknowledged is lost.
//! Closing a session writes [`SEAL_FILE`]; a sealed capture takes no more records.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use super::record::CompletionRecord;

/// The JSONL file in a session's capture directory.
pub const CAPTURE_FILE: &str = "completions.jsonl";
/// Present once the session was closed: the capture is complete.
pub const SEAL_FILE: &str = "sealed";
/// Who the session is ([`SessionMeta`]), written when the session is created.
pub const META_FILE: &str = "session.json";

/// Identity of a captured session, kept beside its completions.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SessionMeta {
    pub session: String,
    #[serde(default)]
    pub task: String,
    /// GRPO group id (job + task).
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub sample: u32,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, serde_json::Value>,
}

/// Write `session.json` atomically (temp file + rename).
pub fn write_meta(dir: &Path, meta: &SessionMeta) -> Result<(), CaptureWriteError> {
    let io = |source| CaptureWriteError::Io {
        path: dir.join(META_FILE),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(".session.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(meta)?).map_err(io)?;
    std::fs::rename(&tmp, dir.join(META_FILE)).map_err(io)
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureWriteError {
    #[error("capture {0} is sealed")]
    Sealed(PathBuf),
    #[error("capture I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("record does not serialize: {0}")]
    Json(#[from] serde_json::Error),
    #[error("capture {0} took part of a record it could not take back: it takes no more")]
    Poisoned(PathBuf),
}

/// How far a record gets before the harness gets its reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// In the kernel (`write`): survives a crash or kill of the gateway process. The sandbox pod
    /// is single-use, so a node crash loses the session anyway and it is retried as an
    /// infrastructure failure.
    #[default]
    Write,
    /// On disk (`fdatasync`): survives a kernel crash or power loss too, at a cost per call.
    Fsync,
}

/// A record as its capture line (JSON and a newline). Encoding is kept apart from
/// [`CaptureLog::append_line`] so that it can run on the caller's thread while only the write
/// itself goes where blocking is allowed.
pub fn encode_line<R: serde::Serialize>(
    record: &CompletionRecord<R>,
) -> Result<Vec<u8>, CaptureWriteError> {
    let mut line = serde_json::to_vec(record)?;
    line.push(b'\n');
    Ok(line)
}

/// Writer for one session's capture directory.
pub struct CaptureLog {
    dir: PathBuf,
    file: File,
    durability: Durability,
    /// A failed write left bytes that could not be cut off again: a record appended after
    /// them would make the file corrupt in its middle.
    poisoned: bool,
}

impl CaptureLog {
    /// Open (creating if needed) the capture of a session in `dir`.
    pub fn open(dir: &Path, durability: Durability) -> Result<Self, CaptureWriteError> {
        let io = |source| CaptureWriteError::Io {
            path: dir.to_path_buf(),
            source,
        };
        if dir.join(SEAL_FILE).exists() {
            return Err(CaptureWriteError::Sealed(dir.to_path_buf()));
        }
        std::fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(CAPTURE_FILE);
        drop_torn_tail(&path).map_err(io)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            file,
            durability,
            poisoned: false,
        })
    }

    /// Append one record and make it durable before returning.
    pub fn append(&mut self, record: &CompletionRecord) -> Result<(), CaptureWriteError> {
        self.append_line(&encode_line(record)?)
    }

    /// Append a line made by [`encode_line`] and make it durable before returning.
    pub fn append_line(&mut self, line: &[u8]) -> Result<(), CaptureWriteError> {
        let io = |source| CaptureWriteError::Io {
            path: self.dir.join(CAPTURE_FILE),
            source,
        };
        if self.poisoned {
            return Err(CaptureWriteError::Poisoned(self.dir.join(CAPTURE_FILE)));
        }
        // A record is whole or not there: the harness gets an error for a record the write or
        // the sync failed on, and its retry must not land after a torn line (the reader would
        // drop it as a torn tail, or refuse the whole capture) nor beside a copy of itself.
        let before = self.file.metadata().map_err(io)?.len();
        let written = self
            .file
            .write_all(line)
            .and_then(|()| match self.durability {
                Durability::Write => Ok(()),
                Durability::Fsync => self.file.sync_data(),
            });
        if let Err(e) = written {
            if self.file.set_len(before).is_err() {
                self.poisoned = true;
            }
            return Err(io(e));
        }
        Ok(())
    }

    /// Seal the capture: no more records; readers know it is complete.
    pub fn seal(self) -> Result<(), CaptureWriteError> {
        let path = self.dir.join(SEAL_FILE);
        File::create(&path)
            .and_then(|f| f.sync_all())
            .map_err(|source| CaptureWriteError::Io { path, source })
    }
}

/// After a crash mid-write the file may end in a partial line. That record was never
/// acknowledged (replies wait for the write), so cut it off; appending after it would turn it
/// into corruption in the middle of the file.
fn drop_torn_tail(path: &Path) -> std::io::Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if bytes.last().is_none_or(|b| *b == b'\n') {
        return Ok(());
    }
    let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    tracing::warn!(path = %path.display(), dropped = bytes.len() - keep, "dropping torn capture tail");
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(keep as u64)?;
    file.sync_all()
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureReadError {
    #[error("cannot read capture {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line}: not a capture record: {source}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

/// A session's capture as read back.
#[derive(Debug, Default)]
pub struct SessionCapture {
    pub records: Vec<CompletionRecord>,
    /// The session was closed (the capture is complete).
    pub sealed: bool,
    /// A torn final line (crash mid-write) was skipped.
    pub torn_tail: bool,
    /// `session.json`, when present.
    pub meta: Option<SessionMeta>,
}

/// The session capture directories among `paths`: each path that holds a capture, or else its
/// immediate subdirectories that do. Sorted, for stable output.
pub fn find_sessions(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for path in paths {
        if path.join(CAPTURE_FILE).is_file() {
            found.push(path.clone());
            continue;
        }
        for entry in std::fs::read_dir(path)? {
            let dir = entry?.path();
            if dir.join(CAPTURE_FILE).is_file() {
                found.push(dir);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// A session's `session.json`, or `None` when it has none.
pub fn read_meta(dir: &Path) -> Result<Option<SessionMeta>, CaptureReadError> {
    match std::fs::read(dir.join(META_FILE)) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| CaptureReadError::Corrupt {
                    path: dir.join(META_FILE),
                    line: 1,
                    source,
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CaptureReadError::Io {
            path: dir.join(META_FILE),
            source,
        }),
    }
}

/// Read a session's capture directory. A torn *last* line is skipped; a bad line anywhere
/// else is corruption and an error.
pub fn read_session(dir: &Path) -> Result<SessionCapture, CaptureReadError> {
    read_session_keeping(dir, |record| record)
}

/// [`read_session`] with each record slimmed as it is read ([`CompletionRecord::slimmed`]): what
/// building a trajectory reads, and no more. A capture holds every call's request twice and
/// its answer (a long agent's conversation over again in every call, and what an agent
/// padded its requests with), so whole it can take many times a trajectory's memory; the
/// gateway reads a session this way whenever it ships one.
pub fn read_session_slim(dir: &Path) -> Result<SessionCapture, CaptureReadError> {
    read_session_keeping(dir, CompletionRecord::slimmed)
}

fn read_session_keeping(
    dir: &Path,
    keep: impl Fn(CompletionRecord) -> CompletionRecord,
) -> Result<SessionCapture, CaptureReadError> {
    let path = dir.join(CAPTURE_FILE);
    let io = |source| CaptureReadError::Io {
        path: path.clone(),
        source,
    };
    let mut file = BufReader::new(File::open(&path).map_err(io)?);
    let meta = read_meta(dir)?;
    let mut capture = SessionCapture {
        sealed: dir.join(SEAL_FILE).exists(),
        meta,
        ..Default::default()
    };
    // A line that did not parse: corruption, unless no line follows it (a torn tail).
    let mut bad: Option<(usize, serde_json::Error)> = None;
    let mut line = Vec::new();
    let mut number = 0;
    loop {
        line.clear();
        if file.read_until(b'\n', &mut line).map_err(io)? == 0 {
            break;
        }
        number += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Some((at, source)) = bad.take() {
            return Err(CaptureReadError::Corrupt {
                path: path.clone(),
                line: at,
                source,
            });
        }
        match serde_json::from_slice(&line) {
            Ok(record) => capture.records.push(keep(record)),
            Err(source) => bad = Some((number, source)),
        }
    }
    capture.torn_tail = bad.is_some();
    super::left::mark(dir, &mut capture.records)?;
    Ok(capture)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64) -> CompletionRecord {
        CompletionRecord {
            session: "s".into(),
            finished_at_ms: seq + 1,
            upstream_ms: 1,
            logprobs: Some(vec![-0.5, -0.25]),
            request: serde_json::json!({}),
            normalized_request: serde_json::json!({}),
            response: serde_json::json!({}),
            ..CompletionRecord::from_tokens(seq, vec![1, 2, 3], vec![4, 5])
        }
    }

    #[test]
    fn appended_records_read_back_and_seal_stops_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog::open(dir.path(), Durability::Fsync).expect("open");
        log.append(&record(0)).expect("append");
        log.append(&record(1)).expect("append");
        log.seal().expect("seal");
        let capture = read_session(dir.path()).expect("read");
        assert_eq!(capture.records, vec![record(0), record(1)]);
        assert!(capture.sealed && !capture.torn_tail);
        assert!(matches!(
            CaptureLog::open(dir.path(), Durability::Fsync),
            Err(CaptureWriteError::Sealed(_))
        ));
    }

    /// A write that fails (a full disk) with bytes that cannot be cut off again: the capture
    /// takes no more records, rather than one after a torn line.
    #[test]
    fn a_failed_write_that_cannot_be_taken_back_poisons_the_capture() {
        let Ok(full) = OpenOptions::new().append(true).open("/dev/full") else {
            return; // not Linux
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog {
            dir: dir.path().to_path_buf(),
            file: full,
            durability: Durability::Write,
            poisoned: false,
        };
        assert!(matches!(
            log.append(&record(0)),
            Err(CaptureWriteError::Io { .. })
        ));
        assert!(matches!(
            log.append(&record(0)),
            Err(CaptureWriteError::Poisoned(_))
        ));
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog::open(dir.path(), Durability::Fsync).expect("open");
        log.append(&record(0)).expect("append");
        drop(log);
        // A crash in the middle of the second write.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(CAPTURE_FILE))
            .expect("file");
        f.write_all(br#"{"v":1,"session":"s","seq":1,"api":"openai_ch"#)
            .expect("torn");
        let capture = read_session(dir.path()).expect("read");
        assert_eq!(capture.records, vec![record(0)]);
        assert!(capture.torn_tail && !capture.sealed);
        // After a restart the torn, never-acknowledged record is cut off and writing goes on.
        let mut log = CaptureLog::open(dir.path(), Durability::Fsync).expect("reopen");
        log.append(&record(2)).expect("append");
        let capture = read_session(dir.path()).expect("read");
        assert_eq!(capture.records, vec![record(0), record(2)]);
        assert!(!capture.torn_tail);
    }

    #[test]
    fn a_slim_read_keeps_what_a_trajectory_reads_and_no_body() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = CaptureLog::open(dir.path(), Durability::Fsync).expect("open");
        let padded = CompletionRecord {
            request: serde_json::json!({"metadata": {"pad": "x".repeat(100_000)}}),
            normalized_request: serde_json::json!({"max_tokens": 2, "messages": []}),
            response: serde_json::json!({"choices": []}),
            ..record(0)
        };
        log.append(&padded).expect("append");
        drop(log);
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(CAPTURE_FILE))
            .expect("file");
        f.write_all(br#"{"v":1,"session":"s","#).expect("torn");
        let capture = read_session_slim(dir.path()).expect("read");
        let want = CompletionRecord {
            request: serde_json::Value::Null,
            normalized_request: serde_json::json!({"max_tokens": 2}),
            response: serde_json::Value::Null,
            ..record(0)
        };
        assert_eq!(capture.records, vec![want]);
        assert!(capture.torn_tail);
    }

    #[test]
    fn a_bad_line_in_the_middle_is_corruption_not_silently_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = serde_json::to_string(&record(0)).expect("json");
        std::fs::write(
            dir.path().join(CAPTURE_FILE),
            format!("{good}\nnot json\n{good}\n"),
        )
        .expect("write");
        for read in [read_session, read_session_slim] {
            assert!(matches!(
                read(dir.path()),
                Err(CaptureReadError::Corrupt { line: 2, .. })
            ));
        }
    }
}
