//! Beside a session's capture: every upstream attempt that failed (`upstream-errors.jsonl`),
//! retried or not. On disk rather than in memory, so that a gateway restarted mid-session
//! still knows the session met an outage when its outcome arrives.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub const UPSTREAM_ERRORS_FILE: &str = "upstream-errors.jsonl";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamErrorRecord {
    /// The call's order number in the session (its capture `seq` had it succeeded).
    pub seq: u64,
    /// 1 for the first try.
    pub attempt: u32,
    /// [`crate::protocol::retry::Failure::kind`].
    pub kind: String,
    /// `retried`, or `failed` when the harness got the error.
    pub result: String,
    pub message: String,
    pub at_ms: u64,
    /// The wait before the next attempt (the job's `modelCallRetry`, or the server's
    /// `Retry-After` when longer); absent when the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
}

/// A session's upstream failures by kind: attempts that were retried, and calls that failed
/// for the harness.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamErrors {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retried: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed: BTreeMap<String, u64>,
}

impl UpstreamErrors {
    pub fn failed_calls(&self) -> u64 {
        self.failed.values().sum()
    }

    pub fn retries(&self) -> u64 {
        self.retried.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.retried.is_empty() && self.failed.is_empty()
    }

    /// `http_502 ×2, timeout ×1`.
    pub fn describe_failed(&self) -> String {
        self.failed
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn add(&mut self, other: &UpstreamErrors) {
        for (mine, theirs) in [
            (&mut self.retried, &other.retried),
            (&mut self.failed, &other.failed),
        ] {
            for (k, n) in theirs {
                *mine.entry(k.clone()).or_default() += n;
            }
        }
    }
}

pub fn append(dir: &Path, record: &UpstreamErrorRecord) -> std::io::Result<()> {
    super::append_json_line(&dir.join(UPSTREAM_ERRORS_FILE), record)
}

/// The tally of a session's file; no file is no error. A torn last line (a crash mid-write)
/// is skipped.
pub fn tally(dir: &Path) -> std::io::Result<UpstreamErrors> {
    let text = match std::fs::read_to_string(dir.join(UPSTREAM_ERRORS_FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e),
    };
    let mut out = UpstreamErrors::default();
    for record in text
        .lines()
        .filter_map(|l| serde_json::from_str::<UpstreamErrorRecord>(l).ok())
    {
        let bucket = if record.result == "failed" {
            &mut out.failed
        } else {
            &mut out.retried
        };
        *bucket.entry(record.kind).or_default() += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn record(seq: u64, kind: &str, result: &str) -> UpstreamErrorRecord {
        UpstreamErrorRecord {
            seq,
            attempt: 1,
            kind: kind.into(),
            result: result.into(),
            message: "x".into(),
            at_ms: 0,
            retry_in_ms: None,
        }
    }

    #[test]
    fn the_file_tallies_retries_and_failed_calls_by_kind() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert!(tally(dir.path())?.is_empty());
        append(dir.path(), &record(0, "connect", "retried"))?;
        append(dir.path(), &record(0, "connect", "retried"))?;
        append(dir.path(), &record(0, "http_502", "failed"))?;
        append(dir.path(), &record(3, "timeout", "failed"))?;
        // A torn last line.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(UPSTREAM_ERRORS_FILE))?
            .write_all(b"{\"seq\": 4, \"ki")?;
        let t = tally(dir.path())?;
        assert_eq!(t.retries(), 2);
        assert_eq!(t.failed_calls(), 2);
        assert_eq!(t.describe_failed(), "http_502 ×1, timeout ×1");
        let mut sum = t.clone();
        sum.add(&t);
        assert_eq!(sum.retried["connect"], 4);
        Ok(())
    }
}
