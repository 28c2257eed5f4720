//! Local mode's disk budget: while the harness runs, its workspace and home together may hold
//! so many bytes and names on the host's disk (`floe run --session-disk`). An agent that fills
//! the disk would otherwise make floe's own writes fail for every session of the run (captures,
//! evaluation copies): infrastructure failures, never scored. Over budget, the harness is
//! stopped as by its timeout, and the session scores as the policy's failure (`disk_limit`).
//!
//! Measured by walking the trees every [`CHECK_EVERY`] (`statat`, no link followed), so a
//! session can overshoot by what it writes in that time. The sandbox's own `/tmp` is memory,
//! sized at start ([`crate::confine`]); pods get the same from their volumes' `sizeLimit`.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Duration;

use crate::tree::{Dir, Kind};

/// How often the harness's disk use is measured.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Names the workspace and home may hold together: inodes run out too.
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Deeper than grading copies ([`crate::workspace::Caps::beyond`]).
const MAX_DEPTH: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub entries: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes the regular files take on disk (a sparse file's holes take none).
    pub bytes: u64,
    /// Names of every kind, directories included.
    pub entries: u64,
}

/// What `roots` hold, counted until `budget` is passed: then `Err`, saying so. A root that is
/// not there holds nothing; a name that vanishes while it is counted is skipped (the agent is
/// at work; the next check sees what stays).
pub fn measure(roots: &[PathBuf], budget: Budget) -> Result<Usage, String> {
    let mut usage = Usage::default();
    for root in roots {
        if let Ok(dir) = Dir::open(root) {
            walk(&dir, 0, budget, &mut usage)?;
        }
    }
    Ok(usage)
}

fn walk(dir: &Dir, depth: usize, budget: Budget, usage: &mut Usage) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("directories more than {MAX_DEPTH} deep"));
    }
    let mut over = None;
    // A directory that cannot be read is skipped, like a name that vanished.
    let _ = dir.each_name(|name| {
        usage.entries += 1;
        let inside = match dir.kind(name) {
            Ok(Some(Kind::File { allocated, .. })) => {
                usage.bytes = usage.bytes.saturating_add(allocated);
                Ok(())
            }
            Ok(Some(Kind::Dir)) => match dir.subdir(name) {
                Ok(sub) => walk(&sub, depth + 1, budget, usage),
                Err(_) => Ok(()),
            },
            _ => Ok(()),
        };
        if let Err(why) = inside {
            over = Some(why);
        } else if usage.bytes > budget.bytes {
            over = Some(format!("more than {} bytes on disk", budget.bytes));
        } else if usage.entries > budget.entries {
            over = Some(format!("more than {} names", budget.entries));
        }
        if over.is_some() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    over.map_or(Ok(()), Err)
}

/// Completes, saying why, once `roots` hold more than `budget`; never otherwise. Measured
/// every [`CHECK_EVERY`] on a blocking thread.
pub async fn exceeded(roots: Vec<PathBuf>, budget: Budget) -> String {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let these = roots.clone();
        if let Ok(Err(why)) = tokio::task::spawn_blocking(move || measure(&these, budget)).await {
            return why;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const ROOMY: Budget = Budget {
        bytes: u64::MAX,
        entries: u64::MAX,
    };

    #[test]
    fn counts_both_trees_on_disk_without_following_links() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let (ws, home) = (dir.path().join("ws"), dir.path().join("home"));
        std::fs::create_dir_all(ws.join("a/b"))?;
        std::fs::create_dir_all(&home)?;
        std::fs::write(ws.join("a/b/data"), vec![7u8; 1 << 20])?;
        std::fs::write(home.join("cache"), vec![7u8; 1 << 20])?;
        // A sparse file takes no disk for its hole; a link to a big file outside counts as a
        // name, not as the file.
        std::fs::File::create(ws.join("sparse"))?.set_len(1 << 40)?;
        let outside = dir.path().join("outside");
        std::fs::write(&outside, vec![7u8; 4 << 20])?;
        symlink(&outside, ws.join("link"))?;
        let usage = measure(&[ws.clone(), home.clone(), dir.path().join("gone")], ROOMY)?;
        assert_eq!(usage.entries, 6, "a, b, data, sparse, link, cache");
        assert!(
            (2 << 20..3 << 20).contains(&usage.bytes),
            "{} bytes",
            usage.bytes
        );
        // Past either budget: stopped, saying which.
        let tight = Budget {
            bytes: 1 << 20,
            entries: u64::MAX,
        };
        let over = measure(&[ws.clone(), home.clone()], tight).err();
        assert_eq!(over.as_deref(), Some("more than 1048576 bytes on disk"));
        let few = Budget {
            bytes: u64::MAX,
            entries: 3,
        };
        let over = measure(&[ws, home], few).err();
        assert_eq!(over.as_deref(), Some("more than 3 names"));
        Ok(())
    }

    #[test]
    fn too_deep_is_over_budget() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut deep = dir.path().to_path_buf();
        for _ in 0..=MAX_DEPTH + 1 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep)?;
        let over = measure(&[dir.path().to_path_buf()], ROOMY).err();
        assert_eq!(over.as_deref(), Some("directories more than 256 deep"));
        Ok(())
    }

    #[tokio::test]
    async fn a_tree_that_outgrows_its_budget_is_noticed_within_a_check(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().to_path_buf();
        let budget = Budget {
            bytes: 1 << 20,
            entries: u64::MAX,
        };
        let watch = tokio::spawn(exceeded(vec![root.clone()], budget));
        tokio::time::sleep(CHECK_EVERY * 2).await;
        assert!(!watch.is_finished(), "an empty tree is within budget");
        std::fs::write(root.join("fill"), vec![7u8; 2 << 20])?;
        let why = tokio::time::timeout(CHECK_EVERY * 3, watch).await??;
        assert_eq!(why, "more than 1048576 bytes on disk");
        Ok(())
    }
}
