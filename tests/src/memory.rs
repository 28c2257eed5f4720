//! A lease on the machine's memory, shared by every test process on it.
//!
//! `scripts/test.sh` runs test binaries side by side (the real-node suite beside the other
//! suites that need vLLM). A few tests start a vLLM and a trainer of their own, several GB each:
//! `local_train`'s train jobs, the real node's train job (vLLM and two trainers in pods), the
//! vision test's own vLLM. Beside the suite's two long-running vLLM servers, two such loads at
//! once would not fit a 24 GB CI machine. Those tests take this lease first: an advisory file
//! lock (`flock`), so it holds across processes and is dropped when its holder exits, however
//! it exits.
//!
//! [`Share::Shared`] holders may run together (`local_train` bounds its own jobs with an
//! in-process lock, from what it measured); [`Share::Exclusive`] runs with no other holder.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

/// Who else may hold the lease beside this holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// Beside other `Shared` holders (never beside an `Exclusive` one).
    Shared,
    /// Alone.
    Exclusive,
}

/// Held until dropped (or the process exits).
#[derive(Debug)]
pub struct MemoryLease {
    _file: File,
}

/// The lock file: `FLOE_TEST_MEMORY_LOCK`, else one per machine under the temporary directory
/// (test runs on one machine share its memory, so they share the lease too).
pub fn lock_path() -> PathBuf {
    std::env::var_os("FLOE_TEST_MEMORY_LOCK")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("floe-test-memory.lock"))
}

/// Takes the lease for `what` (named in the log line when it must wait), blocking until it is
/// free.
pub fn memory_lease(what: &str, share: Share) -> Result<MemoryLease> {
    lease_at(&lock_path(), what, share)
}

fn lease_at(path: &Path, what: &str, share: Share) -> Result<MemoryLease> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("open the memory lease {}", path.display()))?;
    let free = match share {
        Share::Shared => file.try_lock_shared(),
        Share::Exclusive => file.try_lock(),
    };
    if free.is_err() {
        let t0 = Instant::now();
        eprintln!(
            "[memory] {what} waits for the memory lease ({share:?}; {}), held by another test",
            path.display()
        );
        match share {
            Share::Shared => file.lock_shared(),
            Share::Exclusive => file.lock(),
        }
        .with_context(|| format!("lock the memory lease {}", path.display()))?;
        eprintln!(
            "[memory] {what} took the memory lease after {:.0} s",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(MemoryLease { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each lease opens its own file description, so `flock` treats two leases of one process
    /// as it treats two processes'.
    #[test]
    fn exclusive_waits_for_shared_holders_and_shared_ones_share() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("lease.lock");
        let a = lease_at(&path, "a", Share::Shared)?;
        let b = lease_at(&path, "b", Share::Shared)?;
        let probe = OpenOptions::new().write(true).open(&path)?;
        assert!(
            probe.try_lock().is_err(),
            "an exclusive lock beside two shared ones"
        );
        drop(a);
        assert!(
            probe.try_lock().is_err(),
            "an exclusive lock beside one shared one"
        );
        drop(b);
        probe.try_lock()?;
        assert!(
            OpenOptions::new()
                .write(true)
                .open(&path)?
                .try_lock_shared()
                .is_err(),
            "a shared lock beside an exclusive one"
        );
        drop(probe);
        let (tx, rx) = std::sync::mpsc::channel();
        let held = lease_at(&path, "held", Share::Exclusive)?;
        let waiter_path = path.clone();
        let waiter = std::thread::spawn(move || -> Result<()> {
            let _lease = lease_at(&waiter_path, "waiter", Share::Shared)?;
            tx.send(())?;
            Ok(())
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "a shared lease taken while an exclusive one is held"
        );
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(10))?;
        waiter
            .join()
            .map_err(|_| anyhow::anyhow!("waiter panicked"))??;
        Ok(())
    }
}
