//! The dataset directory is one job run's. An `sft` job deleted and created again under its
//! name, with the same `sft.output` claim and path, gives its sessions the same ids as the
//! earlier run's: the collector found their records there and answered every new one "already
//! kept" (409), which the gateways take as delivered, so the new run's data was dropped while
//! the job counted its sessions done. The collector records the job's uid on the directory on
//! its first start (`owner.json`) and refuses another's, saying what to do (as the trainer does
//! with its checkpoint claim). A directory without a record (written before records were
//! kept) is taken as this run's; without a uid (`floe run`, whose `--resume` is its own)
//! nothing is checked.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::spool::write_durably;

pub const OWNER: &str = "owner.json";

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Owner {
    job: String,
    uid: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ForeignDataset {
    #[error(
        "the dataset directory {dir} holds the records of another run of job {job:?} (uid \
         {theirs}; this run is uid {ours}): its sessions have this run's ids, so this run's \
         would be refused as already kept. Give the job another sft.output.path (or claim), or \
         empty this one"
    )]
    Another {
        dir: String,
        job: String,
        theirs: String,
        ours: String,
    },
    #[error("cannot read or write {0}: {1}")]
    Unreadable(String, String),
}

/// Records `job` (uid `uid`) as the owner of `dir`, or refuses a directory another run owns.
pub fn claim(dir: &Path, job: &str, uid: Option<&str>) -> Result<(), ForeignDataset> {
    let Some(uid) = uid.filter(|u| !u.is_empty()) else {
        return Ok(());
    };
    let path = dir.join(OWNER);
    let shown = || path.display().to_string();
    match std::fs::read(&path) {
        Ok(bytes) => {
            let owner: Owner = serde_json::from_slice(&bytes)
                .map_err(|e| ForeignDataset::Unreadable(shown(), e.to_string()))?;
            if owner.uid == uid {
                return Ok(());
            }
            Err(ForeignDataset::Another {
                dir: dir.display().to_string(),
                job: owner.job,
                theirs: owner.uid,
                ours: uid.to_string(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let owner = Owner {
                job: job.to_string(),
                uid: uid.to_string(),
            };
            let bytes = serde_json::to_vec(&owner)
                .map_err(|e| ForeignDataset::Unreadable(shown(), e.to_string()))?;
            write_durably(&path, &bytes)
                .map_err(|e| ForeignDataset::Unreadable(shown(), e.to_string()))
        }
        Err(e) => Err(ForeignDataset::Unreadable(shown(), e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_its_first_runs_and_refuses_another() {
        let dir = tempfile::tempdir().expect("dir");
        claim(dir.path(), "distil", Some("uid-1")).expect("first run");
        claim(dir.path(), "distil", Some("uid-1")).expect("the same run, restarted");
        let refused = claim(dir.path(), "distil", Some("uid-2")).expect_err("another run");
        let said = refused.to_string();
        assert!(
            said.contains("another run of job \"distil\" (uid uid-1; this run is uid uid-2)")
                && said.contains("sft.output.path"),
            "{said}"
        );
        // Without a uid (a local run) nothing is checked or written.
        let local = tempfile::tempdir().expect("dir");
        claim(local.path(), "distil", None).expect("local");
        assert!(!local.path().join(OWNER).exists());
        // A record that cannot be read is not taken as this run's.
        std::fs::write(dir.path().join(OWNER), "{").expect("write");
        assert!(matches!(
            claim(dir.path(), "distil", Some("uid-1")),
            Err(ForeignDataset::Unreadable(..))
        ));
    }
}
