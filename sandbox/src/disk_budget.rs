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
use std::path::{Path, PathBuf};
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
        // The agent owns its roots: one it made unreadable (`chmod 300`, still writable) would
        // otherwise count as empty to a runner that is not root.
        if let Ok(dir) = Dir::open_entering(root) {
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
/// every [`CHECK_EVERY`] on a blocking thread. With a `holder` (the harness's processes),
/// files they unlinked but keep open on the roots' file systems count too: no walk finds
/// them, and an agent could otherwise fill the host's disk unseen (`fallocate`, `rm`, keep
/// the descriptor).
pub async fn exceeded(roots: Vec<PathBuf>, budget: Budget, holder: Option<Holder>) -> String {
    let devices: Vec<u64> = roots
        .iter()
        .filter_map(|r| std::fs::metadata(r).ok())
        .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
        .collect();
    let on = FileSystems::Devices(devices);
    first_failed_check(move || {
        // The trees first, against the whole budget: no scan of descriptors can delay it.
        let usage = measure(&roots, budget)?;
        let Some(holder) = &holder else {
            return Ok(());
        };
        within(usage, unlinked_but_open(holder, &on)?, budget)
    })
    .await
}

/// [`exceeded`] for `bytes` (and [`MAX_ENTRIES`] names); with no budget, never.
pub async fn watch(roots: Vec<PathBuf>, bytes: Option<u64>, holder: Option<Holder>) -> String {
    match bytes {
        Some(bytes) => {
            let budget = Budget {
                bytes,
                entries: MAX_ENTRIES,
            };
            exceeded(roots, budget, holder).await
        }
        None => std::future::pending().await,
    }
}

/// The agent container's half of a pod's budget: completes, saying why, once the files
/// `holder`'s processes unlinked but keep open, on any file system on disk, and what `roots`
/// hold come to more than `budget`. The grader walks the trees on its own every check, from
/// a container whose CPU the agent cannot take; here they are walked only while some file is
/// held, to add the two. Such a file escapes the kubelet too (it measures volumes and a
/// container's layer by their names), so without this an agent could fill the node's disk.
///
/// `beside`: files the agent may write outside the trees, counted too, and emptied when the
/// budget is passed: the kubelet's termination-message file, which it bind-mounts writable
/// for all at `/dev/termination-log` in every container and no ephemeral-storage limit counts
/// (kubernetes/kubernetes#122224), so an agent could fill the node through it.
pub async fn held_exceeded(
    roots: Vec<PathBuf>,
    beside: Vec<PathBuf>,
    budget: Budget,
    holder: Holder,
) -> String {
    first_failed_check(move || {
        let held = unlinked_but_open(&holder, &FileSystems::OnDisk)?
            .saturating_add(beside.iter().map(|f| allocated(f)).sum::<u64>());
        match held {
            0 => Ok(()),
            held => within(measure(&roots, budget)?, held, budget),
        }
    })
    .await
}

/// The kubelet's termination-message file, bind-mounted writable for all in every container,
/// on the node's disk and counted by no ephemeral-storage limit (kubernetes/kubernetes#122224).
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// The most it may take: the kubelet reads 4096 bytes of it, and floe's own summary is less.
pub const TERMINATION_LOG_LIMIT: u64 = 1 << 20;
/// How often such files are measured: a `stat` each, so often.
const FILES_CHECK_EVERY: Duration = Duration::from_millis(250);

/// Completes, saying why, once one of `files` takes more than `limit` bytes on disk, emptied
/// first; never when none of them is there. With or without a disk budget: whoever can write
/// there (the agent, or its code under test in the grader) could otherwise fill the node's
/// disk through it, and a node under disk pressure evicts its pods, a loss turned into
/// infrastructure.
pub async fn files_outgrown(files: Vec<PathBuf>, limit: u64) -> String {
    let files: Vec<PathBuf> = files
        .into_iter()
        .filter(|f| std::fs::metadata(f).is_ok_and(|m| m.is_file()))
        .collect();
    if files.is_empty() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(FILES_CHECK_EVERY).await;
        for f in &files {
            let held = allocated(f);
            if held > limit {
                empty_files(std::slice::from_ref(f));
                return format!(
                    "{held} bytes written to {}, which no storage limit counts (at most {limit})",
                    f.display()
                );
            }
        }
    }
}

/// [`files_outgrown`] for the kubelet's termination log ([`TERMINATION_LOG`], where there is
/// one), at [`TERMINATION_LOG_LIMIT`].
pub async fn termination_log_outgrown() -> String {
    files_outgrown(vec![PathBuf::from(TERMINATION_LOG)], TERMINATION_LOG_LIMIT).await
}

/// What a regular file at `path` takes on disk (0 for anything else, or nothing there).
fn allocated(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map_or(0, |m| m.blocks().saturating_mul(512))
}

/// Empties each regular file of `files` (the ones [`held_exceeded`] counts beside the trees).
pub fn empty_files(files: &[PathBuf]) {
    for f in files {
        if std::fs::metadata(f).is_ok_and(|m| m.is_file()) {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(f);
        }
    }
}

/// `check`, every [`CHECK_EVERY`] on a blocking thread, until it fails: its reason.
async fn first_failed_check<F>(check: F) -> String
where
    F: Fn() -> Result<(), String> + Clone + Send + 'static,
{
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        if let Ok(Err(why)) = tokio::task::spawn_blocking(check.clone()).await {
            return why;
        }
    }
}

/// The trees' `usage` and `held` bytes of deleted files against `budget`.
fn within(usage: Usage, held: u64, budget: Budget) -> Result<(), String> {
    if usage.bytes.saturating_add(held) > budget.bytes {
        return Err(format!(
            "more than {} bytes on disk, {held} of them in files deleted but still open or \
             outside the workspace and home",
            budget.bytes
        ));
    }
    Ok(())
}

/// Whose deleted files count: where the agent can write and what would otherwise fill a disk.
#[derive(Clone, Debug)]
pub enum FileSystems {
    /// Files on these devices (local mode: the roots'; the rest of the host is read-only in
    /// the sandbox, and its `/tmp` is memory).
    Devices(Vec<u64>),
    /// Files on any file system not in memory (a pod's agent container: its own layer, its
    /// volumes, wherever it can write). A file in memory (`tmpfs`, a `memfd`) is charged to
    /// the container's memory limit instead.
    OnDisk,
}

impl FileSystems {
    /// Whether the open file `fd` (a `/proc` descriptor link) is on one of these.
    fn holds(&self, fd: &std::path::Path, dev: u64) -> bool {
        match self {
            Self::Devices(devices) => devices.contains(&dev),
            Self::OnDisk => rustix::fs::statfs(fd).is_ok_and(|fs| !in_memory(fs.f_type)),
        }
    }
}

/// Whether `path` is on a file system whose files are memory (a tmpfs `/tmp`).
pub fn is_memory(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|fs| in_memory(fs.f_type))
}

/// File systems whose files are memory (`statfs`'s magic numbers, `linux/magic.h`): `tmpfs`
/// (`memfd`s and `/dev/shm` too), `ramfs`, `hugetlbfs`. The type's width and sign vary with
/// the target; the magic numbers are 32 bits.
fn in_memory(f_type: impl Into<i128>) -> bool {
    const TMPFS: i128 = 0x0102_1994;
    const RAMFS: i128 = 0x8584_58f6;
    const HUGETLBFS: i128 = 0x9584_58f6;
    [TMPFS, RAMFS, HUGETLBFS].contains(&(f_type.into() & 0xffff_ffff))
}

/// The harness's processes: its session's cgroup when it has one (every process of the
/// session, whatever it forks), else every process below its `bwrap` (an orphan is reparented
/// to the sandbox's own init, never outside its PID namespace).
#[derive(Clone, Debug)]
pub struct Holder {
    pub root: u32,
    /// A `cgroup.procs` of the session's cgroup.
    pub cgroup_procs: Option<PathBuf>,
}

/// Descriptors one check reads at most: past it the session is over its budget (an agent
/// could otherwise stall the check with millions of duplicated descriptors).
pub const MAX_DESCRIPTORS: usize = 1_000_000;

/// Bytes on `on` that `holder`'s processes hold in files they unlinked but keep open.
/// Best effort: what a process hides from `/proc` (made not dumpable, in a run that is not
/// root) or holds only through a mapping is not seen.
pub fn unlinked_but_open(holder: &Holder, on: &FileSystems) -> Result<u64, String> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let (mut bytes, mut read) = (0u64, 0usize);
    // Every thread's table: a thread may have one of its own (`unshare(CLONE_FILES)`), and a
    // process whose main thread exited lists nothing at `/proc/<pid>/fd`.
    for thread in threads(holder) {
        let Ok(fds) = std::fs::read_dir(thread.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            read += 1;
            if read > MAX_DESCRIPTORS {
                return Err(format!("more than {MAX_DESCRIPTORS} open descriptors"));
            }
            let unlinked = std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().ends_with(" (deleted)"));
            if !unlinked {
                continue;
            }
            // The link leads to the open file itself, whatever became of its name.
            let Ok(m) = std::fs::metadata(fd.path()) else {
                continue;
            };
            if m.is_file()
                && m.nlink() == 0
                && on.holds(&fd.path(), m.dev())
                && seen.insert((m.dev(), m.ino()))
            {
                bytes = bytes.saturating_add(m.blocks().saturating_mul(512));
            }
        }
    }
    Ok(bytes)
}

/// Every thread of `holder`'s processes, as its `/proc/<pid>/task/<tid>` directory: the
/// session's cgroup's processes when it has one, else `root` and every process below it.
fn threads(holder: &Holder) -> Vec<PathBuf> {
    let listed = holder
        .cgroup_procs
        .as_ref()
        .and_then(|procs| std::fs::read_to_string(procs).ok());
    match listed {
        Some(pids) => pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .flat_map(threads_of)
            .collect(),
        None => descendants(holder.root),
    }
}

fn threads_of(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|threads| threads.flatten().map(|t| t.path()).collect())
        .unwrap_or_default()
}

/// The threads of `root` and of every process below it, found from each thread's `children`.
fn descendants(root: u32) -> Vec<PathBuf> {
    let mut pids = vec![root];
    let mut known: std::collections::HashSet<u32> = pids.iter().copied().collect();
    let mut threads = Vec::new();
    let mut next = 0;
    while next < pids.len() {
        let pid = pids[next];
        next += 1;
        for thread in threads_of(pid) {
            let children = std::fs::read_to_string(thread.join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if known.insert(child) {
                    pids.push(child);
                }
            }
            threads.push(thread);
        }
    }
    threads
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    const ROOMY: Budget = Budget {
        bytes: u64::MAX,
        entries: u64::MAX,
    };

    fn tree(root: u32) -> Holder {
        Holder {
            root,
            cgroup_procs: None,
        }
    }

    /// A pod's termination log on its own, with no budget: past its limit it is emptied and
    /// the watch says so; under it, or absent, the watch never completes.
    #[tokio::test]
    async fn a_file_past_its_own_limit_is_emptied_and_said(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("termination-log");
        std::fs::write(&log, b"short")?;
        let quiet = tokio::time::timeout(
            FILES_CHECK_EVERY * 4,
            files_outgrown(vec![log.clone(), dir.path().join("absent")], 4096),
        )
        .await;
        assert!(quiet.is_err(), "a file within its limit: {quiet:?}");
        let absent = tokio::time::timeout(
            FILES_CHECK_EVERY * 2,
            files_outgrown(vec![dir.path().join("x")], 0),
        )
        .await;
        assert!(absent.is_err(), "no file: {absent:?}");
        let writer = {
            let log = log.clone();
            std::thread::spawn(move || {
                std::thread::sleep(FILES_CHECK_EVERY);
                std::fs::write(&log, vec![1u8; 64 << 10])
            })
        };
        let why = tokio::time::timeout(
            FILES_CHECK_EVERY * 8,
            files_outgrown(vec![log.clone()], 4096),
        )
        .await?;
        writer.join().map_err(|_| "writer")??;
        assert!(
            why.contains("termination-log") && why.contains("at most 4096"),
            "{why}"
        );
        assert_eq!(std::fs::metadata(&log)?.len(), 0, "emptied");
        Ok(())
    }

    /// A file beside the trees (a pod's `/dev/termination-log`) counts with them, and is
    /// emptied once the budget is passed; a path that is no regular file counts nothing.
    #[tokio::test]
    async fn a_file_beside_the_trees_counts_and_is_emptied(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("workspace");
        std::fs::create_dir(&root)?;
        std::fs::write(root.join("a"), vec![1u8; 256 << 10])?;
        let log = dir.path().join("termination-log");
        std::fs::write(&log, vec![1u8; 2 << 20])?;
        let budget = Budget {
            bytes: 1 << 20,
            entries: MAX_ENTRIES,
        };
        let beside = vec![log.clone(), dir.path().join("absent"), root.clone()];
        let why = tokio::time::timeout(
            CHECK_EVERY * 3,
            held_exceeded(vec![root], beside, budget, tree(std::process::id())),
        )
        .await?;
        assert!(why.contains("outside the workspace"), "{why}");
        empty_files(&[log.clone(), dir.path().join("absent")]);
        assert_eq!(std::fs::metadata(&log)?.len(), 0);
        Ok(())
    }

    /// A file unlinked but kept open by a process below the harness is on the disk all the
    /// same: counted, once, on the roots' file systems only.
    #[test]
    fn files_deleted_but_held_open_below_the_harness_count(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("big");
        // A grandchild (the subshell's `sleep`) holds it: 4 MiB written, then the name gone.
        let script =
            r#"( exec 3>"$1"; head -c 4194304 /dev/zero >&3; rm "$1"; exec sleep 30 ) & wait"#;
        let mut child = std::process::Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(&file)
            .spawn()?;
        let root = child.id();
        let device = std::fs::metadata(dir.path())?.dev();
        let mut held = 0;
        for _ in 0..100 {
            held = unlinked_but_open(&tree(root), &FileSystems::Devices(vec![device]))?;
            if held > 0 && !file.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let elsewhere = unlinked_but_open(&tree(root), &FileSystems::Devices(vec![device + 1]))?;
        let mut sibling = std::process::Command::new("sleep").arg("30").spawn()?;
        let not_below =
            unlinked_but_open(&tree(sibling.id()), &FileSystems::Devices(vec![device]))?;
        for c in [&mut child, &mut sibling] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!((4 << 20..5 << 20).contains(&held), "{held} bytes");
        assert_eq!(elsewhere, 0, "another file system's");
        assert_eq!(not_below, 0, "another process tree's");
        Ok(())
    }

    /// A process holding `file` (written with `mib` MiB, then unlinked) until killed.
    fn hold_deleted(file: &Path, mib: u32) -> std::io::Result<std::process::Child> {
        let script = format!(
            r#"exec 3>"$1"; head -c {} /dev/zero >&3; rm "$1"; exec sleep 30"#,
            mib << 20
        );
        std::process::Command::new("sh")
            .args(["-c", &script, "sh"])
            .arg(file)
            .spawn()
    }

    /// In a pod's agent container a deleted file counts on any file system on disk, wherever
    /// the agent opened it; one in memory (`/dev/shm`) is its memory limit's, not its disk's.
    #[test]
    fn on_disk_counts_a_deleted_file_on_any_disk_but_none_in_memory(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // The checkout is on disk wherever the tests run (a `/tmp` may be memory).
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR"))?;
        let on_disk = dir.path().join("big");
        let mut held = vec![hold_deleted(&on_disk, 3)?];
        let shm = Path::new("/dev/shm");
        let in_shm = shm.join(format!("floe-test-{}", std::process::id()));
        if rustix::fs::statfs(shm).is_ok_and(|fs| in_memory(fs.f_type)) {
            held.push(hold_deleted(&in_shm, 5)?);
        }
        let mut counted = 0;
        for _ in 0..100 {
            counted = held
                .iter()
                .map(|c| unlinked_but_open(&tree(c.id()), &FileSystems::OnDisk))
                .sum::<Result<u64, _>>()?;
            if counted > 0 && !on_disk.exists() && !in_shm.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for c in &mut held {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!((3 << 20..4 << 20).contains(&counted), "{counted} bytes");
        Ok(())
    }

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

    /// The agent owns its roots: one it made unreadable but still writable (`chmod 300`) is
    /// counted, by a runner without root's power over permissions too.
    #[test]
    fn a_root_the_agent_made_unreadable_still_counts() -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home)?;
        std::fs::write(home.join("fill"), vec![7u8; 2 << 20])?;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o300))?;
        let roots = vec![home];
        let measured = std::thread::spawn(move || -> Result<Usage, String> {
            // This thread alone without root's power (capabilities are per thread), or the
            // test could not fail when it runs as root.
            use rustix::thread::CapabilitySet;
            let mut caps = rustix::thread::capabilities(None).map_err(|e| e.to_string())?;
            caps.effective.remove(
                CapabilitySet::DAC_OVERRIDE
                    | CapabilitySet::DAC_READ_SEARCH
                    | CapabilitySet::FOWNER,
            );
            rustix::thread::set_capabilities(None, caps).map_err(|e| e.to_string())?;
            measure(&roots, ROOMY)
        })
        .join()
        .map_err(|_| "the thread panicked")??;
        assert!(measured.bytes >= 2 << 20, "{measured:?}");
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
        let watch = tokio::spawn(exceeded(vec![root.clone()], budget, None));
        tokio::time::sleep(CHECK_EVERY * 2).await;
        assert!(!watch.is_finished(), "an empty tree is within budget");
        std::fs::write(root.join("fill"), vec![7u8; 2 << 20])?;
        let why = tokio::time::timeout(CHECK_EVERY * 3, watch).await??;
        assert_eq!(why, "more than 1048576 bytes on disk");
        Ok(())
    }
}
