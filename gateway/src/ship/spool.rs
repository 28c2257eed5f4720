//! The on-disk spool: a trajectory is written here (atomically) before any delivery attempt
//! and moved to `shipped/` only after the sink accepted it.
//!
//! ```text
//! SPOOL/pending/<session>.json    waiting for (re)delivery
//! SPOOL/shipped/<session>.json    accepted by the sink (the trajectory reference)
//! SPOOL/rejected/<session>.json   refused by the sink with a permanent error (kept, never lost)
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Sink;
use crate::trajectory::Trajectory;

/// One spooled delivery: where it goes and what.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SpoolEntry {
    pub sink: Sink,
    pub trajectory: Trajectory,
    /// Why the sink refused it (only in `rejected/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("spool entry {path} is not valid JSON: {source}")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
}

#[derive(Clone, Debug)]
pub struct Spool {
    root: PathBuf,
}

const PENDING: &str = "pending";
const SHIPPED: &str = "shipped";
const REJECTED: &str = "rejected";

impl Spool {
    pub fn open(root: &Path) -> Result<Self, SpoolError> {
        for sub in [PENDING, SHIPPED, REJECTED] {
            let dir = root.join(sub);
            std::fs::create_dir_all(&dir).map_err(|source| SpoolError::Io { path: dir, source })?;
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    fn path(&self, state: &str, session: &str) -> PathBuf {
        self.root.join(state).join(format!("{session}.json"))
    }

    pub fn pending_path(&self, session: &str) -> PathBuf {
        self.path(PENDING, session)
    }

    pub fn shipped_path(&self, session: &str) -> PathBuf {
        self.path(SHIPPED, session)
    }

    /// Write an entry to `pending/` durably (temp file, fsync, rename). Idempotent.
    pub fn put(&self, entry: &SpoolEntry) -> Result<PathBuf, SpoolError> {
        let path = self.pending_path(&entry.trajectory.session);
        let bytes = serde_json::to_vec(entry).map_err(|source| SpoolError::Corrupt {
            path: path.clone(),
            source,
        })?;
        write_durably(&path, &bytes)?;
        Ok(path)
    }

    pub fn is_shipped(&self, session: &str) -> bool {
        self.shipped_path(session).exists()
    }

    pub fn is_rejected(&self, session: &str) -> bool {
        self.path(REJECTED, session).exists()
    }

    pub fn is_pending(&self, session: &str) -> bool {
        self.pending_path(session).exists()
    }

    /// The sink accepted it: move `pending/` → `shipped/`.
    pub fn mark_shipped(&self, session: &str) -> Result<PathBuf, SpoolError> {
        let to = self.shipped_path(session);
        std::fs::rename(self.pending_path(session), &to).map_err(|source| SpoolError::Io {
            path: to.clone(),
            source,
        })?;
        Ok(to)
    }

    /// The sink refused it for good: keep it under `rejected/` with the reason.
    pub fn mark_rejected(&self, mut entry: SpoolEntry, reason: &str) -> Result<(), SpoolError> {
        let session = entry.trajectory.session.clone();
        entry.rejected = Some(reason.to_string());
        let path = self.path(REJECTED, &session);
        let bytes = serde_json::to_vec(&entry).map_err(|source| SpoolError::Corrupt {
            path: path.clone(),
            source,
        })?;
        write_durably(&path, &bytes)?;
        let pending = self.pending_path(&session);
        std::fs::remove_file(&pending).map_err(|source| SpoolError::Io {
            path: pending,
            source,
        })
    }

    /// How many entries wait for delivery, by their names: [`Spool::pending`] reads and parses
    /// each (a trajectory may be hundreds of MiB), which a drain polling every 100 ms must not.
    pub fn pending_count(&self) -> Result<usize, SpoolError> {
        let dir = self.root.join(PENDING);
        let io = |source| SpoolError::Io {
            path: dir.clone(),
            source,
        };
        let mut n = 0;
        for item in std::fs::read_dir(&dir).map_err(io)? {
            if item
                .map_err(io)?
                .path()
                .extension()
                .and_then(|e| e.to_str())
                == Some("json")
            {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Entries waiting for delivery (after a restart: everything not yet acknowledged).
    pub fn pending(&self) -> Result<Vec<SpoolEntry>, SpoolError> {
        let dir = self.root.join(PENDING);
        let io = |source| SpoolError::Io {
            path: dir.clone(),
            source,
        };
        let mut entries = Vec::new();
        for item in std::fs::read_dir(&dir).map_err(io)? {
            let path = item.map_err(io)?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue; // a temp file left by a crash mid-write
            }
            entries.push(read_entry(&path)?);
        }
        entries.sort_by(|a, b| a.trajectory.session.cmp(&b.trajectory.session));
        Ok(entries)
    }

    /// Point every pending entry bound for a trainer at `to` instead: a resumed local run
    /// starts its trainer on a new address with a new token, and what the interrupted run
    /// spooled for the old one must reach the new one. Returns how many were changed.
    pub fn redirect_pending(&self, to: &Sink) -> Result<usize, SpoolError> {
        let mut changed = 0;
        for mut entry in self.pending()? {
            if matches!(entry.sink, Sink::Trainer { .. }) && entry.sink != *to {
                entry.sink = to.clone();
                self.put(&entry)?;
                changed += 1;
            }
        }
        Ok(changed)
    }

    pub fn read_shipped(&self, session: &str) -> Result<SpoolEntry, SpoolError> {
        read_entry(&self.shipped_path(session))
    }
}

fn read_entry(path: &Path) -> Result<SpoolEntry, SpoolError> {
    let bytes = std::fs::read(path).map_err(|source| SpoolError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| SpoolError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
}

/// Temp file in the same directory, fsync, rename over `path`: readers see the old file or
/// the whole new one, and a crash leaves at most an ignored `.tmp`.
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), SpoolError> {
    use std::io::Write;
    let io = |source| SpoolError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    sync_parent(path);
    Ok(())
}

/// The rename lives in the directory: without its own sync a power loss may undo it (the
/// trajectory acknowledged, then gone). The file is in place already, so a directory that
/// cannot be synced is said, not a failed write; a file system that refuses to sync one (some
/// network and FUSE ones) has nothing more to do.
fn sync_parent(path: &Path) {
    let Some(dir) = path.parent() else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        Err(e) if e.kind() != std::io::ErrorKind::InvalidInput => {
            tracing::warn!(path = %path.display(), "cannot sync the directory of the rename: {e}");
        }
        _ => {}
    }
}

/// `path` = the given JSON files, one compact line each, in the order given, written like
/// [`write_durably`] but streamed: one file in memory at a time, however large the dataset
/// (a whole dataset held at once is the size of every trajectory in it). Returns the lines.
pub fn write_jsonl_durably(path: &Path, files: &[PathBuf]) -> std::io::Result<u64> {
    write_jsonl_durably_seeing(path, files, |_, _| ())
}

/// [`write_jsonl_durably`], showing `seen` each file's path and bytes as they are written (so
/// a caller that needs them too reads each file once).
pub fn write_jsonl_durably_seeing(
    path: &Path,
    files: &[PathBuf],
    mut seen: impl FnMut(&Path, &[u8]),
) -> std::io::Result<u64> {
    use std::io::Write;
    let tmp = path.with_extension("jsonl.tmp");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    for file in files {
        let text = std::fs::read(file)?;
        seen(file, &text);
        // Each file is one JSON value written compactly (`serde_json::to_vec`): no newline.
        out.write_all(text.trim_ascii())?;
        out.write_all(b"\n")?;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_parent(path);
    Ok(files.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::{build_trajectory, BuildOptions, SessionInfo, SessionOutcome};

    fn entry(session: &str) -> SpoolEntry {
        let info = SessionInfo {
            session: session.into(),
            task: "t".into(),
            group: "g".into(),
            ..Default::default()
        };
        SpoolEntry {
            sink: Sink::None,
            trajectory: build_trajectory(
                &info,
                &[],
                &BuildOptions::default(),
                &SessionOutcome::Unscored,
            ),
            rejected: None,
        }
    }

    #[test]
    fn pending_survives_reopen_until_shipped() -> Result<(), SpoolError> {
        let dir = tempfile::tempdir().map_err(|source| SpoolError::Io {
            path: PathBuf::new(),
            source,
        })?;
        let spool = Spool::open(dir.path())?;
        spool.put(&entry("b"))?;
        spool.put(&entry("a"))?;
        spool.put(&entry("a"))?; // idempotent
        std::fs::write(dir.path().join("pending/c.json.tmp"), b"{torn").map_err(|source| {
            SpoolError::Io {
                path: PathBuf::new(),
                source,
            }
        })?;
        let reopened = Spool::open(dir.path())?;
        let sessions: Vec<_> = reopened
            .pending()?
            .into_iter()
            .map(|e| e.trajectory.session)
            .collect();
        assert_eq!(sessions, ["a", "b"]);
        assert_eq!(reopened.pending_count()?, 2, "the torn temp file is none");
        reopened.mark_shipped("a")?;
        assert!(reopened.is_shipped("a"));
        reopened.mark_rejected(entry("b"), "400 bad")?;
        assert!(reopened.pending()?.is_empty());
        assert_eq!(reopened.pending_count()?, 0);
        let rejected = read_entry(&dir.path().join("rejected/b.json"))?;
        assert_eq!(rejected.rejected.as_deref(), Some("400 bad"));
        Ok(())
    }

    #[test]
    fn pending_entries_for_a_trainer_are_redirected_and_others_kept() -> Result<(), SpoolError> {
        let dir = tempfile::tempdir().map_err(|source| SpoolError::Io {
            path: PathBuf::new(),
            source,
        })?;
        let spool = Spool::open(dir.path())?;
        let old = Sink::Trainer {
            url: "http://127.0.0.1:1/v1/trajectories".into(),
            token: Some("old".into()),
            snapshots: false,
        };
        let new = Sink::Trainer {
            url: "http://127.0.0.1:2/v1/trajectories".into(),
            token: Some("new".into()),
            snapshots: false,
        };
        let mut to_trainer = entry("a");
        to_trainer.sink = old;
        spool.put(&to_trainer)?;
        spool.put(&entry("b"))?; // Sink::None: not a trainer's
        assert_eq!(spool.redirect_pending(&new)?, 1);
        assert_eq!(spool.redirect_pending(&new)?, 0, "already there");
        let sinks: Vec<Sink> = spool.pending()?.into_iter().map(|e| e.sink).collect();
        assert_eq!(sinks, [new, Sink::None]);
        Ok(())
    }

    #[test]
    fn a_dataset_is_streamed_one_line_per_file_in_the_order_given() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
        std::fs::write(&a, "{\"session\":\"a\"}\n")?;
        std::fs::write(&b, "{\"session\":\"b\"}")?;
        let out = dir.path().join("dataset.jsonl");
        std::fs::write(&out, "old\n")?;
        assert_eq!(write_jsonl_durably(&out, &[b, a])?, 2);
        assert_eq!(
            std::fs::read_to_string(&out)?,
            "{\"session\":\"b\"}\n{\"session\":\"a\"}\n"
        );
        assert!(!dir.path().join("dataset.jsonl.tmp").exists());
        Ok(())
    }
}
