//! Local mode's sandbox: the harness and the evaluator each run inside bubblewrap (`bwrap`,
//! the tool Flatpak and Codex CLI use on Linux), so the agent sees nothing of the run but its
//! own workspace and cannot outlive its turn. Sans-IO: this builds the `bwrap` command line;
//! the runner starts it like any other command ([`crate::process`]).
//!
//! What the command line gives each process (threat model: `docs/security.md`):
//! - every namespace new (`--unshare-all`): its own PID namespace, so when the harness exits
//!   the namespace's init dies and the kernel kills everything the agent left running, before
//!   grading starts; its own network namespace with only a loopback device; a user namespace
//!   in which it is an ordinary user with no capabilities — in a root run one that makes it an
//!   unprivileged host user of its own ([`crate::sandbox_user`]);
//! - the host's file system read-only, a fresh `/tmp`, and the run's private paths hidden
//!   (`--out`, the job file, the task file: hidden tests, captures, spool, every session's
//!   state) — then only its own workspace (and harness home) bound back writable;
//! - the model API only: a relay inside the sandbox ([`crate::relay`]) listens on the
//!   gateway's loopback address and forwards to the gateway's unix socket, bound in. There is
//!   no other route out, so the model server cannot be called past the capture. The socket
//!   sits in the sandbox's `/tmp`, which the agent can rewrite, so the relay pins it before
//!   the agent exists and never looks the path up again;
//! - a seccomp filter ([`crate::syscall_filter`]) on the command itself: no unix-domain socket,
//!   so no host daemon's socket, though the file system shows them read-only.
//!
//! The sandbox's first process is always `floe sandbox-exec` (the relay, when there is a
//! gateway route): it installs the filter on the command, not on itself.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::process::CommandSpec;

/// Where the floe binary and the gateway socket appear inside the sandbox (in its own `/tmp`,
/// which exists whatever the host's layout).
pub const FLOE_INSIDE: &str = "/tmp/.floe/floe";
pub const SOCKET_INSIDE: &str = "/tmp/.floe/gateway.sock";

use crate::sandbox_user::{Kept, Narrowed, SandboxUser, INSIDE as UNPRIVILEGED};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
    /// The `bwrap` binary.
    pub bwrap: PathBuf,
    /// Host paths nothing in the sandbox may see: directories become empty, files empty.
    pub hidden: Vec<Hidden>,
    /// The gateway, for the harness (the evaluator gets no network at all).
    pub gateway: Option<GatewayRoute>,
    /// The `floe` binary (its `sandbox-exec` subcommand starts every confined command).
    pub floe: PathBuf,
    /// The uid/gid of the run (the sandboxed processes are mapped to them, unless `user`).
    pub uid: u32,
    pub gid: u32,
    /// A root run's: the host user the sandboxed processes are instead ([`crate::sandbox_user`]).
    pub user: Option<SandboxUser>,
    /// Host directories `user` cannot enter, shown narrowed to what the sandbox needs of them.
    pub narrowed: Vec<Narrowed>,
    /// Each session's cgroup limits ([`crate::limits`]); `None` where the machine does not let
    /// floe make cgroups.
    pub limits: Option<crate::limits::Limits>,
    /// The size of the sandbox's `/tmp`, a tmpfs (memory); `0`: tmpfs's default, half the
    /// machine's memory (a bubblewrap before 0.7 cannot size it).
    pub tmp_bytes: u64,
}

/// A hidden directory is an empty tmpfs the sandbox could write to: this much at most.
const HIDDEN_DIR_BYTES: u64 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hidden {
    Dir(PathBuf),
    File(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayRoute {
    /// The gateway's unix socket on the host.
    pub socket: PathBuf,
    /// The loopback address the harness is told (its `*_BASE_URL`); the relay listens on it
    /// inside the sandbox's own network namespace.
    pub listen: SocketAddr,
}

/// What one confined process may touch besides the read-only system.
#[derive(Clone, Debug, Default)]
pub struct Access<'a> {
    /// Bound writable at the same path (the workspace, the harness home).
    pub writable: Vec<&'a Path>,
    /// Bound read-only at the same path (the instruction file).
    pub read_only: Vec<&'a Path>,
    /// Route the model API through the relay (the harness), or no network (the evaluator).
    pub model_api: bool,
    /// The session's `cgroup.procs` files the command joins before `bwrap` starts.
    pub cgroup_procs: Vec<PathBuf>,
}

impl Confinement {
    /// `bwrap` options, in order: namespaces, the read-only host, what is hidden, then what is
    /// bound back (a later mount shadows an earlier one, so the order is the policy).
    pub fn options(&self, access: &Access, cwd: &Path) -> Vec<String> {
        let namespaces: &[&str] = match &self.user {
            None => &["--unshare-all"],
            // The run's user namespace, joined (`--userns` excludes unsharing one), with only
            // the capabilities `floe sandbox-exec` needs to become the sandbox's user.
            Some(_) => &[
                "--userns",
                crate::sandbox_user::USERNS_FD,
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                // To empty the bounding set before it becomes the sandbox's user.
                "--cap-add",
                "CAP_SETPCAP",
            ],
        };
        let mut args: Vec<String> = namespaces
            .iter()
            .chain(&[
                "--die-with-parent",
                // No controlling terminal to push input into (TIOCSTI), no signals to our group.
                "--new-session",
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
            ])
            .map(|s| s.to_string())
            .collect();
        // tmpfs is memory: sized, so filling it cannot take the machine's (bwrap ≥ 0.7);
        // `/dev/shm` too, which `--dev` would leave at half the machine's memory, counted
        // by no budget (memory no process holds, so an OOM kill would take another's). Set
        // up by root in the run's namespace, `/tmp` and `/dev/shm` would be root's: they are
        // made the sandbox user's to write, as a host's are (sticky, world-writable).
        for dir in ["/tmp", "/dev/shm"] {
            if self.tmp_bytes > 0 {
                push(&mut args, ["--size", &self.tmp_bytes.to_string()]);
            }
            if self.user.is_some() {
                push(&mut args, ["--perms", "1777"]);
            }
            push(&mut args, ["--tmpfs", dir]);
        }
        // With the run's namespace, the set-up is root's and `floe sandbox-exec` then becomes
        // the sandbox's user.
        if self.user.is_none() {
            let (uid, gid) = if self.uid == 0 {
                (UNPRIVILEGED, UNPRIVILEGED)
            } else {
                (self.uid, self.gid)
            };
            push(&mut args, ["--uid", &uid.to_string()]);
            push(&mut args, ["--gid", &gid.to_string()]);
        }
        for narrowed in &self.narrowed {
            push(&mut args, ["--perms", "0711", "--tmpfs", &s(&narrowed.dir)]);
            for keep in &narrowed.keep {
                match keep {
                    // `-try`: one removed since the run began is just not there.
                    Kept::Dir(p) => push(&mut args, ["--ro-bind-try", &s(p), &s(p)]),
                    Kept::Link { path, target } => {
                        push(&mut args, ["--symlink", &s(target), &s(path)])
                    }
                }
            }
        }
        // A hidden path inside a narrowed directory and outside what it keeps is not there.
        let shown = |p: &Path| {
            self.narrowed.iter().all(|n| {
                !p.starts_with(&n.dir)
                    || n.keep
                        .iter()
                        .any(|k| matches!(k, Kept::Dir(d) if p.starts_with(d)))
            })
        };
        // One below a hidden directory is hidden with it (and its mount point could not be
        // made, were it gone since: the directory is a fresh tmpfs by then).
        let within_another = |p: &Path| {
            self.hidden
                .iter()
                .any(|h| matches!(h, Hidden::Dir(d) if p != d && p.starts_with(d)))
        };
        for hidden in self.hidden.iter().filter(|h| {
            let (Hidden::Dir(p) | Hidden::File(p)) = h;
            shown(p) && !within_another(p)
        }) {
            match hidden {
                Hidden::Dir(p) if self.tmp_bytes > 0 => push(
                    &mut args,
                    ["--size", &HIDDEN_DIR_BYTES.to_string(), "--tmpfs", &s(p)],
                ),
                Hidden::Dir(p) => push(&mut args, ["--tmpfs", &s(p)]),
                Hidden::File(p) => push(&mut args, ["--ro-bind", "/dev/null", &s(p)]),
            }
        }
        for (p, bind) in access
            .writable
            .iter()
            .map(|p| (p, "--bind"))
            .chain(access.read_only.iter().map(|p| (p, "--ro-bind")))
        {
            if self.user.is_some() {
                // The directories bubblewrap 0.8 made on the way to a bound path were root's
                // and closed (mode 0700, seen here): made first, open to pass through (0755).
                let mut on_the_way: Vec<&Path> = p.ancestors().skip(1).collect();
                on_the_way.pop();
                for dir in on_the_way.into_iter().rev() {
                    push(&mut args, ["--dir", &s(dir)]);
                }
            }
            push(&mut args, [bind, &s(p), &s(p)]);
        }
        push(&mut args, ["--ro-bind", &s(&self.floe), FLOE_INSIDE]);
        if let (true, Some(route)) = (access.model_api, &self.gateway) {
            // Read-only: `connect()` needs no writable mount, and one run's socket serves every
            // session, so an agent that owns it (the sandbox user) must not chmod it shut.
            push(&mut args, ["--ro-bind", &s(&route.socket), SOCKET_INSIDE]);
        }
        push(&mut args, ["--chdir", &s(cwd)]);
        args
    }

    /// `spec` run inside the sandbox: the same logs, timeout and environment, its program
    /// behind `bwrap` and `floe sandbox-exec` (the relay too, for a harness).
    pub fn wrap(&self, spec: CommandSpec, access: &Access) -> CommandSpec {
        let mut args = self.still_there().options(access, &spec.cwd);
        if !access.model_api {
            // The evaluator's `floe sandbox-exec` is the namespace's init: every orphan comes
            // to it, and nothing the evaluated code runs can signal it (an init ignores its own
            // namespace's signals), so its count of what was left behind stands.
            args.push("--as-pid-1".into());
        }
        push(&mut args, ["--", FLOE_INSIDE, "sandbox-exec"]);
        if let (Some(route), true) = (&self.gateway, access.model_api) {
            push(
                &mut args,
                [
                    "--listen",
                    &route.listen.to_string(),
                    "--socket",
                    SOCKET_INSIDE,
                ],
            );
        }
        if !access.model_api {
            // The evaluator: a process it leaves behind voids its verdict.
            args.push("--no-stragglers".into());
        }
        if self.user.is_some() {
            let inside = format!("{UNPRIVILEGED}:{UNPRIVILEGED}");
            push(&mut args, ["--become", &inside]);
        }
        args.push("--".into());
        args.push(spec.program.clone());
        args.extend(spec.args.iter().cloned());
        let (program, args) = self.launcher(args);
        if access.cgroup_procs.is_empty() {
            return CommandSpec {
                program,
                args,
                ..spec
            };
        }
        // Into the session's cgroups first: everything `bwrap` starts is inside.
        let mut joined = vec![
            "-c".to_string(),
            crate::limits::JOIN.to_string(),
            "floe-cgroup".into(),
        ];
        joined.extend(access.cgroup_procs.iter().map(|p| s(p)));
        joined.push("--".into());
        joined.push(program);
        joined.extend(args);
        CommandSpec {
            program: "sh".into(),
            args: joined,
            ..spec
        }
    }

    /// `bwrap` with these arguments; with the run's user namespace, behind the shell that
    /// opens it on the descriptor `--userns` names.
    fn launcher(&self, bwrap_args: Vec<String>) -> (String, Vec<String>) {
        match &self.user {
            None => (s(&self.bwrap), bwrap_args),
            Some(user) => {
                let mut args = vec![
                    "-c".to_string(),
                    crate::sandbox_user::OPEN_USERNS.to_string(),
                    "floe-userns".into(),
                    s(user.userns_path()),
                    s(&self.bwrap),
                ];
                args.extend(bwrap_args);
                // By its path: `floe doctor` probes with a PATH of its choosing.
                ("/bin/sh".into(), args)
            }
        }
    }

    /// This confinement without the hidden paths removed since the run began (a token logged
    /// out, a mounted secret rotated): bubblewrap would have to make their mount points on the
    /// read-only host, and every later session would fail to start.
    fn still_there(&self) -> std::borrow::Cow<'_, Confinement> {
        let there = |h: &Hidden| {
            let (Hidden::Dir(p) | Hidden::File(p)) = h;
            std::fs::symlink_metadata(p).is_ok()
        };
        if self.hidden.iter().all(there) {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(Confinement {
            hidden: self.hidden.iter().filter(|h| there(h)).cloned().collect(),
            ..self.clone()
        })
    }

    /// A command that only checks the sandbox can be set up here (the pre-flight check).
    pub fn probe(&self, cwd: &Path) -> (String, Vec<String>) {
        let mut args = self.options(&Access::default(), cwd);
        args.extend(["--".to_string(), "true".to_string()]);
        self.launcher(args)
    }

    /// The host uid/gid what the sandbox writes must belong to, when not `floe run`'s own.
    pub fn host_owner(&self) -> Option<(u32, u32)> {
        self.user.as_ref().map(|u| (u.uid, u.gid))
    }

    /// Gives `paths` (trees floe made for a confined command) to the root run's sandbox user,
    /// who must be able to write or read them; nothing to do otherwise.
    pub fn hand_over(&self, paths: &[&Path]) -> Result<(), String> {
        let Some((uid, gid)) = self.host_owner() else {
            return Ok(());
        };
        for path in paths {
            crate::sandbox_user::give(path, uid, gid)
                .map_err(|e| format!("giving {} to the sandbox's user: {e}", path.display()))?;
        }
        Ok(())
    }
}

fn push<const N: usize>(args: &mut Vec<String>, items: [&str; N]) {
    args.extend(items.iter().map(|s| s.to_string()));
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Where `program` would be found from `cwd` with `PATH`, as `execvp` looks for it: a path
/// with a `/` as is (relative to `cwd`), a bare name on `PATH`. `None`: nothing executable
/// there, so the harness would not start (an infrastructure failure, said before `bwrap`
/// turns it into an ordinary exit code).
pub fn resolve_program(program: &str, cwd: &Path, path_var: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = cwd.join(program);
        return executable(&p).then_some(p);
    }
    path_var?
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| cwd.join(d).join(program))
        .find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn confinement() -> Confinement {
        Confinement {
            bwrap: "/usr/bin/bwrap".into(),
            hidden: vec![
                Hidden::Dir("/runs/out".into()),
                Hidden::File("/jobs/job.yaml".into()),
            ],
            gateway: Some(GatewayRoute {
                socket: "/tmp/floe-x/gw.sock".into(),
                listen: "127.0.0.1:8370".parse().expect("addr"),
            }),
            floe: "/usr/local/bin/floe".into(),
            uid: 0,
            gid: 0,
            user: None,
            narrowed: vec![],
            limits: None,
            tmp_bytes: 0,
        }
    }

    fn spec() -> CommandSpec {
        CommandSpec {
            program: "codex".into(),
            args: vec!["exec".into(), "fix it".into()],
            env: vec![("HOME".into(), "/runs/out/s/home".into())],
            env_remove: vec![],
            cwd: "/runs/out/s/workspace".into(),
            stdout: "/runs/out/s/logs/harness.stdout".into(),
            stderr: "/runs/out/s/logs/harness.stderr".into(),
            cap_bytes: 1,
            timeout: Duration::from_secs(1),
            kill_grace: Duration::from_secs(1),
            drop_capabilities: false,
            refuse_adoption: false,
        }
    }

    fn writable<'a>(paths: &[&'a Path], model_api: bool) -> Access<'a> {
        Access {
            writable: paths.to_vec(),
            read_only: vec![],
            model_api,
            cgroup_procs: vec![],
        }
    }

    fn position(args: &[String], window: &[&str]) -> usize {
        args.windows(window.len())
            .position(|w| w.iter().zip(window).all(|(a, b)| a == b))
            .unwrap_or_else(|| panic!("{window:?} not in {args:?}"))
    }

    #[test]
    fn the_workspace_is_bound_back_after_the_output_directory_is_hidden() {
        let ws = Path::new("/runs/out/s/workspace");
        let access = writable(&[ws, Path::new("/runs/out/s/home")], true);
        let args = confinement().options(&access, ws);
        let hidden = position(&args, &["--tmpfs", "/runs/out"]);
        let bound = position(
            &args,
            &["--bind", "/runs/out/s/workspace", "/runs/out/s/workspace"],
        );
        assert!(position(&args, &["--ro-bind", "/", "/"]) < hidden);
        assert!(hidden < bound, "{args:?}");
        assert!(position(&args, &["--ro-bind", "/dev/null", "/jobs/job.yaml"]) < bound);
        assert!(args.contains(&"--unshare-all".to_string()));
        // A root run's agent is an ordinary user in its namespace.
        position(&args, &["--uid", "1000"]);
    }

    #[test]
    fn a_hidden_path_below_a_hidden_directory_or_gone_since_is_not_mounted() -> std::io::Result<()>
    {
        let host = tempfile::tempdir()?;
        let (kept, gone) = (host.path().join("secrets"), host.path().join("token"));
        std::fs::create_dir(&kept)?;
        let mut c = confinement();
        c.hidden = vec![
            Hidden::File(kept.join("..2026_12_07/token")),
            Hidden::Dir(kept.clone()),
            Hidden::File(gone.clone()),
        ];
        let args = c.options(&Access::default(), Path::new("/"));
        assert!(!args.iter().any(|a| a.contains("..2026_12_07")), "{args:?}");
        position(&args, &["--tmpfs", &kept.display().to_string()]);
        // Gone since the run began: bubblewrap could not make its mount point on the read-only
        // host, and the session would not start.
        position(
            &args,
            &["--ro-bind", "/dev/null", &gone.display().to_string()],
        );
        let wrapped = c.wrap(spec(), &Access::default());
        assert!(
            !wrapped.args.contains(&gone.display().to_string()),
            "{:?}",
            wrapped.args
        );
        position(&wrapped.args, &["--tmpfs", &kept.display().to_string()]);
        Ok(())
    }

    #[test]
    fn the_harness_runs_behind_the_relay_with_its_own_arguments() {
        let access = writable(&[Path::new("/runs/out/s/workspace")], true);
        let wrapped = confinement().wrap(spec(), &access);
        assert_eq!(wrapped.program, "/usr/bin/bwrap");
        let tail = &wrapped.args[position(&wrapped.args, &["--", FLOE_INSIDE])..];
        assert_eq!(
            tail,
            [
                "--",
                FLOE_INSIDE,
                "sandbox-exec",
                "--listen",
                "127.0.0.1:8370",
                "--socket",
                SOCKET_INSIDE,
                "--",
                "codex",
                "exec",
                "fix it"
            ]
        );
        // The run's one gateway socket, which no session may chmod shut for the others.
        let socket = position(&wrapped.args, &[SOCKET_INSIDE]);
        assert_eq!(wrapped.args[socket - 2], "--ro-bind", "{:?}", wrapped.args);
        // Logs, environment and timeout are the runner's, outside the sandbox.
        assert_eq!(wrapped.stdout, spec().stdout);
        assert_eq!(wrapped.env, spec().env);
        position(&wrapped.args, &["--chdir", "/runs/out/s/workspace"]);
    }

    #[test]
    fn the_evaluator_gets_no_network_route() {
        let access = writable(&[Path::new("/runs/out/s/eval")], false);
        let wrapped = confinement().wrap(spec(), &access);
        assert!(!wrapped.args.iter().any(|a| a == "--listen"));
        assert!(!wrapped.args.iter().any(|a| a == SOCKET_INSIDE));
        // Its `floe sandbox-exec` is the namespace's init (nothing inside can signal it).
        assert!(wrapped.args.iter().any(|a| a == "--as-pid-1"));
        // Still started by `floe sandbox-exec`, for the syscall filter.
        let tail = &wrapped.args[position(&wrapped.args, &["--", FLOE_INSIDE])..];
        assert_eq!(
            tail,
            [
                "--",
                FLOE_INSIDE,
                "sandbox-exec",
                "--no-stragglers",
                "--",
                "codex",
                "exec",
                "fix it"
            ]
        );
    }

    #[test]
    fn tmpfs_mounts_are_sized_when_a_size_is_given() {
        let args = confinement().options(&Access::default(), Path::new("/"));
        assert!(!args.contains(&"--size".to_string()), "{args:?}");
        let sized = Confinement {
            tmp_bytes: 4 << 30,
            ..confinement()
        };
        let args = sized.options(&Access::default(), Path::new("/"));
        position(&args, &["--size", "4294967296", "--tmpfs", "/tmp"]);
        // In a non-root run too: `--dev` alone leaves it at half the machine's memory.
        position(&args, &["--size", "4294967296", "--tmpfs", "/dev/shm"]);
        position(&args, &["--size", "1048576", "--tmpfs", "/runs/out"]);
    }

    #[test]
    fn a_non_root_run_keeps_its_own_ids() {
        let c = Confinement {
            uid: 1234,
            gid: 99,
            ..confinement()
        };
        let args = c.options(&Access::default(), Path::new("/"));
        position(&args, &["--uid", "1234", "--gid", "99"]);
    }

    #[test]
    fn a_root_run_sets_up_in_its_namespace_and_becomes_the_sandbox_user() -> std::io::Result<()> {
        let c = Confinement {
            user: Some(SandboxUser::held_at(65534, 65534, "/proc/7/fd/9")?),
            narrowed: vec![Narrowed {
                dir: "/root".into(),
                keep: vec![
                    Kept::Dir("/root/.cache".into()),
                    Kept::Link {
                        path: "/root/data".into(),
                        target: "/mnt/data".into(),
                    },
                ],
            }],
            hidden: vec![
                Hidden::Dir("/runs/out".into()),
                Hidden::Dir("/root/.ssh".into()),
                Hidden::File("/root/.cache/huggingface/token".into()),
            ],
            ..confinement()
        };
        let access = writable(&[Path::new("/runs/out/s/workspace")], true);
        let wrapped = c.wrap(spec(), &access);
        assert_eq!(wrapped.program, "/bin/sh");
        assert_eq!(
            wrapped.args[..6],
            [
                "-c",
                crate::sandbox_user::OPEN_USERNS,
                "floe-userns",
                "/proc/7/fd/9",
                "/usr/bin/bwrap",
                "--userns"
            ]
        );
        let args = &wrapped.args;
        // Set up as root in the run's namespace, no new one, no uid of bwrap's choosing.
        assert!(!args.iter().any(|a| a == "--unshare-all" || a == "--uid"));
        position(args, &["--cap-drop", "ALL", "--cap-add", "CAP_SETUID"]);
        // Root's home: passable, holding only what is needed; what is hidden in it and not
        // kept is not there at all, what is hidden in what is kept still is.
        position(args, &["--perms", "1777", "--tmpfs", "/tmp"]);
        position(args, &["--perms", "1777", "--tmpfs", "/dev/shm"]);
        let narrowed = position(args, &["--perms", "0711", "--tmpfs", "/root"]);
        let kept = position(args, &["--ro-bind-try", "/root/.cache", "/root/.cache"]);
        assert!(narrowed < kept);
        // A link stays a link: bound, it would show its target past what is hidden there.
        assert!(position(args, &["--symlink", "/mnt/data", "/root/data"]) > narrowed);
        assert!(!args.iter().any(|a| a == "/root/.ssh"));
        // (`options`: `wrap` leaves out hidden paths this host lacks.)
        let options = c.options(&access, Path::new("/"));
        let kept_there = position(&options, &["--ro-bind-try", "/root/.cache", "/root/.cache"]);
        assert!(position(&options, &["/dev/null", "/root/.cache/huggingface/token"]) > kept_there);
        // The way to the workspace is made passable before it is bound.
        let way = position(
            args,
            &[
                "--dir",
                "/runs",
                "--dir",
                "/runs/out",
                "--dir",
                "/runs/out/s",
            ],
        );
        assert!(way < position(args, &["--bind", "/runs/out/s/workspace"]));
        let tail = &args[position(args, &["--", FLOE_INSIDE])..];
        position(tail, &["--become", "1000:1000", "--", "codex"]);
        // The pre-flight probe goes through the same namespace.
        let (program, probe) = c.probe(Path::new("/"));
        assert_eq!(
            (program.as_str(), &probe[3]),
            ("/bin/sh", &"/proc/7/fd/9".to_string())
        );
        assert_eq!(c.host_owner(), Some((65534, 65534)));
        assert_eq!(confinement().host_owner(), None);
        Ok(())
    }

    #[test]
    fn programs_are_found_as_execvp_finds_them() -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin)?;
        let tool = bin.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n")?;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755))?;
        std::fs::write(bin.join("data"), "")?;
        let path = format!("/nonexistent:{}", bin.display());
        assert_eq!(resolve_program("tool", dir.path(), Some(&path)), Some(tool));
        assert_eq!(resolve_program("data", dir.path(), Some(&path)), None);
        assert_eq!(resolve_program("missing", dir.path(), Some(&path)), None);
        assert!(resolve_program("./bin/tool", dir.path(), None).is_some());
        assert_eq!(resolve_program("./bin/data", dir.path(), None), None);
        Ok(())
    }
}
