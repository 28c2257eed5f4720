//! Per-session resource limits in local mode: each session's harness, and then its evaluator,
//! run in a cgroup of the session's own (one each), with a memory and a process-count limit
//! and an equal CPU weight, so a fork bomb, a memory fill or a thousand busy processes in one session cannot
//! make a concurrent sibling time out or its evaluator die (scored 0, which raises the
//! attacker's group advantage). Pods get the same from their containers' resources.
//!
//! floe makes the cgroups under its own, where the machine lets it: cgroup v2 with the
//! `memory` and `pids` controllers delegated to floe's cgroup, or cgroup v1's `memory` and
//! `pids` hierarchies writable (a root run). Elsewhere there are no limits, and `floe run` says
//! so at start. Commands join the session's cgroup through a shell that writes its own pid into
//! each `cgroup.procs` and then `exec`s `bwrap`: everything the sandbox starts is inside.

use std::path::{Path, PathBuf};

/// Where session cgroups are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2: floe's own cgroup directory.
    V2(PathBuf),
    /// cgroup v1: floe's cgroup in the `memory` and in the `pids` hierarchy, and in the `cpu`
    /// one where it is mounted.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: Option<PathBuf>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub hierarchy: Hierarchy,
    /// Bytes of memory for the session (harness and evaluator together, one at a time).
    pub memory_bytes: u64,
    /// Processes (and threads) at once.
    pub pids: u64,
}

/// `4Gi`, `512Mi`, `100Ki` or a number of bytes (`floe run --session-memory`,
/// `--session-disk`, a pool template's `diskBudget`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        _ => {
            return Err(format!(
                "{text:?}: a number of bytes, or one with Ki, Mi, Gi or Ti"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: a number of bytes, or one with Ki, Mi, Gi or Ti"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.hierarchy {
            Hierarchy::V2(_) => "cgroup v2",
            Hierarchy::V1 { .. } => "cgroup v1",
        };
        write!(
            f,
            "{kind}: {} MiB, {} processes per session",
            self.memory_bytes >> 20,
            self.pids
        )
    }
}

/// Sans-IO: floe's cgroup paths from `/proc/self/cgroup` under `root` (`/sys/fs/cgroup`):
/// the v1 `memory` and `pids` hierarchies when both are mounted, else the v2 path.
pub fn from_proc_cgroup(text: &str, root: &Path, v1: bool) -> Option<Hierarchy> {
    let mut memory = None;
    let mut pids = None;
    let mut cpu = None;
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let relative = path.trim_start_matches('/');
        for c in controllers.split(',') {
            match c {
                "memory" => memory = Some(root.join("memory").join(relative)),
                "pids" => pids = Some(root.join("pids").join(relative)),
                // Co-mounted with cpuacct, its directory is `cpu,cpuacct`, and `cpu` a link.
                "cpu" => cpu = Some(root.join("cpu").join(relative)),
                _ => {}
            }
        }
        if controllers.is_empty() {
            unified = Some(root.join(relative));
        }
    }
    match (v1, memory, pids, unified) {
        (true, Some(memory), Some(pids), _) => Some(Hierarchy::V1 { memory, pids, cpu }),
        (false, _, _, Some(dir)) => Some(Hierarchy::V2(dir)),
        _ => None,
    }
}

/// This machine's hierarchy, if floe can make limited cgroups in it (tried: a probe cgroup is
/// made and removed). `Err` says why not.
pub fn detect() -> Result<Hierarchy, String> {
    let root = Path::new("/sys/fs/cgroup");
    let text = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let v2 = root.join("cgroup.controllers").exists();
    let hierarchy = from_proc_cgroup(&text, root, !v2)
        .ok_or_else(|| "no memory and pids controllers for this process".to_string())?;
    let probe = format!("floe-probe-{}", std::process::id());
    let limits = Limits {
        hierarchy: hierarchy.clone(),
        memory_bytes: 1 << 30,
        pids: 64,
    };
    SessionCgroup::create(&limits, &probe).map(drop)?;
    Ok(hierarchy)
}

/// A session's cgroup(s), removed when dropped (whatever is left in them killed first).
pub struct SessionCgroup {
    dirs: Vec<PathBuf>,
    limits: Limits,
}

impl SessionCgroup {
    /// The cgroup a session's harness runs in.
    pub fn for_session(limits: &Limits, session: &str) -> Result<Self, String> {
        Self::create(limits, &cgroup_name(session))
    }

    /// A cgroup of its own for a session's evaluator, made once its agent ended, under a name
    /// the agent could not have made first.
    pub fn for_grading(limits: &Limits, session: &str) -> Result<Self, String> {
        Self::create(
            limits,
            &format!("{}-grading-{:016x}", cgroup_name(session), nonce()),
        )
    }

    pub fn create(limits: &Limits, name: &str) -> Result<Self, String> {
        let mut made = Self {
            dirs: Vec::new(),
            limits: limits.clone(),
        };
        let mkdir = |made: &mut Self, dir: PathBuf| -> Result<PathBuf, String> {
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            made.dirs.push(dir.clone());
            Ok(dir)
        };
        match &limits.hierarchy {
            Hierarchy::V2(base) => {
                // The controllers must be enabled for floe's children (delegation allows it).
                // `cpu` on its own: where it is not delegated, memory and pids still are. With
                // it, sibling sessions share the CPU by equal weights, whatever their process
                // counts: a session of a thousand busy processes gets no more than one of one.
                let _ = std::fs::write(base.join("cgroup.subtree_control"), "+memory +pids");
                let _ = std::fs::write(base.join("cgroup.subtree_control"), "+cpu");
                mkdir(&mut made, base.join(name))?;
            }
            Hierarchy::V1 { memory, pids, cpu } => {
                mkdir(&mut made, memory.join(name))?;
                mkdir(&mut made, pids.join(name))?;
                // Equal `cpu.shares` (the default) among sibling sessions: the CPU is shared
                // by session, not by process. Best effort: a cpu hierarchy floe cannot write
                // leaves memory and pids limited.
                if let Some(cpu) = cpu.as_ref().filter(|c| c.is_dir()) {
                    let _ = mkdir(&mut made, cpu.join(name));
                }
            }
        }
        made.set_limits()?;
        Ok(made)
    }

    /// Write the session's limits. The evaluator runs in a cgroup of its own, made after the
    /// agent ended (the agent's could have had its limits rewritten, where the run's user owns
    /// it, from a cgroup namespace of the agent's own, and still holds the memory of the files
    /// it left on a tmpfs).
    fn set_limits(&self) -> Result<(), String> {
        let write = |dir: &Path, file: &str, value: String| {
            std::fs::write(dir.join(file), value)
                .map_err(|e| format!("{}: {e}", dir.join(file).display()))
        };
        let (memory, pids) = (self.limits.memory_bytes, self.limits.pids);
        match (&self.limits.hierarchy, self.dirs.as_slice()) {
            (Hierarchy::V2(_), [dir, ..]) => {
                write(dir, "memory.max", memory.to_string())?;
                let _ = write(dir, "memory.swap.max", "0".into());
                write(dir, "pids.max", pids.to_string())?;
            }
            (Hierarchy::V1 { .. }, [memory_dir, pids_dir, ..]) => {
                write(memory_dir, "memory.limit_in_bytes", memory.to_string())?;
                // With swap accounting the limit covers swap too; without, the file is absent.
                let _ = write(
                    memory_dir,
                    "memory.memsw.limit_in_bytes",
                    memory.to_string(),
                );
                write(pids_dir, "pids.max", pids.to_string())?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The `cgroup.procs` files a command's first process writes itself into.
    pub fn procs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }
}

impl Drop for SessionCgroup {
    fn drop(&mut self) {
        for dir in self.dirs.iter().rev() {
            for _ in 0..50 {
                let left = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in left.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// A session's cgroup: unique on the machine (two runs may hold the same session ids).
fn cgroup_name(session: &str) -> String {
    let safe: String = session
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    format!("floe-{}-{safe}", std::process::id())
}

/// A number no one can tell in advance (std's per-process random hash keys, and the clock).
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// The shell that puts a command into the session's cgroups: `sh -c JOIN floe-cgroup PROCS…
/// -- PROGRAM ARGS…`. It writes its own pid into each file, then becomes the program; exit 125
/// if it cannot (before the program exists, so a sandbox that never announced its start).
pub const JOIN: &str =
    r#"while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@""#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_kubernetes_style() {
        assert_eq!(parse_bytes("4Gi"), Ok(4 << 30));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("4GB").is_err());
        assert!(parse_bytes("Gi").is_err());
        assert!(parse_bytes("99999999999Ti").is_err());
    }

    /// Where this machine lets floe make cgroups (a root run): a command that joins a
    /// session's cgroups is in its own cpu cgroup too, so sessions share the CPU by session.
    #[test]
    fn a_session_shares_the_cpu_as_one() -> Result<(), Box<dyn std::error::Error>> {
        let Ok(hierarchy) = detect() else {
            eprintln!("no cgroups floe may make here: nothing to check");
            return Ok(());
        };
        let limits = Limits {
            hierarchy: hierarchy.clone(),
            memory_bytes: 64 << 20,
            pids: 16,
        };
        let name = format!("floe-cpu-test-{}", std::process::id());
        let session = SessionCgroup::create(&limits, &name)?;
        let mut args = vec!["-c".to_string(), JOIN.into(), "join".into()];
        args.extend(session.procs().iter().map(|p| p.display().to_string()));
        args.extend(["--", "cat", "/proc/self/cgroup"].map(String::from));
        let out = std::process::Command::new("sh").args(&args).output()?;
        let cgroups = String::from_utf8_lossy(&out.stdout);
        match &hierarchy {
            Hierarchy::V1 { cpu: Some(_), .. } => {
                let cpu = cgroups.lines().find(|l| {
                    l.split(':')
                        .nth(1)
                        .is_some_and(|c| c.split(',').any(|c| c == "cpu"))
                });
                assert!(
                    cpu.is_some_and(|l| l.ends_with(&format!("/{name}"))),
                    "{cgroups}"
                );
            }
            Hierarchy::V2(base) => {
                let parent = std::fs::read_to_string(base.join("cgroup.controllers"))?;
                let mine = std::fs::read_to_string(base.join(&name).join("cgroup.controllers"))?;
                if parent.split_whitespace().any(|c| c == "cpu") {
                    assert!(mine.split_whitespace().any(|c| c == "cpu"), "{mine}");
                }
            }
            Hierarchy::V1 { cpu: None, .. } => {}
        }
        Ok(())
    }

    #[test]
    fn the_hierarchy_is_read_from_proc_self_cgroup() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n0::/\n";
        assert_eq!(
            from_proc_cgroup(v1, root, true),
            Some(Hierarchy::V1 {
                memory: "/sys/fs/cgroup/memory/process_api/abc".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                cpu: None,
            })
        );
        let with_cpu = "3:cpu,cpuacct:/job\n8:pids:/job\n4:memory:/job\n";
        assert_eq!(
            from_proc_cgroup(with_cpu, root, true),
            Some(Hierarchy::V1 {
                memory: "/sys/fs/cgroup/memory/job".into(),
                pids: "/sys/fs/cgroup/pids/job".into(),
                cpu: Some("/sys/fs/cgroup/cpu/job".into()),
            })
        );
        let v2 = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/floe.scope\n";
        assert_eq!(
            from_proc_cgroup(v2, root, false),
            Some(Hierarchy::V2(
                "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/floe.scope"
                    .into()
            ))
        );
        // v1 without a pids hierarchy: no limits.
        assert_eq!(from_proc_cgroup("4:memory:/x\n", root, true), None);
        // Combined controllers on one line.
        assert!(from_proc_cgroup("3:memory,pids:/x\n", root, true).is_some());
    }

    #[test]
    fn the_join_shell_enters_every_file_then_runs_the_program() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(JOIN)
            .arg("floe-cgroup")
            .args([&a, &b])
            .args(["--", "sh", "-c", "echo $$"])
            .output()?;
        assert!(out.status.success());
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        // The program is the shell itself after `exec`: the same pid was written.
        assert_eq!(std::fs::read_to_string(&a)?.trim(), pid);
        assert_eq!(std::fs::read_to_string(&b)?.trim(), pid);
        let refused = std::process::Command::new("sh")
            .arg("-c")
            .arg(JOIN)
            .arg("floe-cgroup")
            .args(["/nonexistent/cgroup.procs", "--", "true"])
            .status()?;
        assert_eq!(refused.code(), Some(125));
        Ok(())
    }
}
