//! The local run's sandbox ([`floe_sandbox::confine`]): find bubblewrap and prove it works here
//! before anything runs (a pre-flight check), then, once the gateway listens, the confinement
//! every session's runner applies. `--no-sandbox` runs without one, and the summary says so.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floe_sandbox::confine::{Confinement, GatewayRoute, Hidden};
use floe_sandbox::limits::Limits;
use floe_sandbox::sandbox_user::SandboxUser;

use super::RunError;

/// Where bubblewrap is looked for: `$FLOE_BWRAP`, else `bwrap` on `PATH`.
const BWRAP_VAR: &str = "FLOE_BWRAP";

/// A bubblewrap that set up a sandbox on this machine.
pub struct Bubblewrap {
    path: PathBuf,
    version: String,
    /// Each session's cgroup limits, or why there are none.
    limits: Option<Result<Limits, String>>,
    /// Each sandbox's `/tmp` size ([`Confinement::tmp_bytes`]).
    tmp_bytes: u64,
    /// Each session's disk budget (`--session-disk`), for the description.
    disk_bytes: u64,
    /// A root run's: the host user its sandboxes are (`--sandbox-user`).
    user: Option<SandboxUser>,
}

impl Bubblewrap {
    /// With the per-session limits this machine allows; none is said on stderr at once.
    pub fn with_limits(self, args: &super::session_limits::SessionLimitArgs) -> Self {
        let limits = super::session_limits::resolve(args);
        if let Err(why) = &limits {
            eprintln!(
                "floe run: no per-session resource limits ({why}): one session's fork bomb or \
                 memory fill can make its siblings fail"
            );
        }
        Self {
            limits: Some(limits),
            tmp_bytes: super::session_limits::tmp_bytes(args, &self.version),
            disk_bytes: args.session_disk,
            ..self
        }
    }
}

/// What the summary records: `bubblewrap 0.8.0` and the sessions' limits, or why there was no
/// sandbox.
pub fn describe(bwrap: Option<&Bubblewrap>) -> String {
    match bwrap {
        Some(b) => {
            let limits = match &b.limits {
                Some(Ok(limits)) => format!("{}; {limits}", b.version),
                Some(Err(why)) => format!("{}; no per-session limits ({why})", b.version),
                None => b.version.clone(),
            };
            let limits = match b.disk_bytes {
                0 => format!("{limits}; no disk budget"),
                bytes => format!("{limits}; {} MiB of disk per session", bytes >> 20),
            };
            format!("{limits}; {}", agents(b))
        }
        None => {
            "none (--no-sandbox: the agent could read hidden tests and reach the network)".into()
        }
    }
}

/// Finds bubblewrap and runs a probe sandbox with the options sessions will use; in a root
/// run, as `sandbox_user` (`--sandbox-user`), in a user namespace made for it.
pub fn check(sandbox_user: (u32, u32)) -> Result<Bubblewrap, RunError> {
    let hint = "or pass --no-sandbox to run the agents unconfined (recorded in summary.json)";
    let path = match std::env::var_os(BWRAP_VAR) {
        Some(p) => PathBuf::from(p),
        None => find_on_path("bwrap").ok_or_else(|| {
            RunError::Preflight(format!(
                "floe run sandboxes every agent with bubblewrap, and `bwrap` is not on PATH: install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) or set {BWRAP_VAR}, {hint}"
            ))
        })?,
    };
    let version = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|e| RunError::Preflight(format!("{}: {e}; {hint}", path.display())))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let floe = floe_binary()?;
    let user = match nix::unistd::geteuid().is_root() {
        true => Some(
            SandboxUser::create(&floe, sandbox_user.0, sandbox_user.1)
                .map_err(|e| RunError::Preflight(format!("{e}; {hint}")))?,
        ),
        false => None,
    };
    let probe = Confinement {
        bwrap: path.clone(),
        hidden: vec![],
        gateway: None,
        floe,
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        user: user.clone(),
        narrowed: vec![],
        limits: None,
        tmp_bytes: 0,
    };
    let (program, args) = probe.probe(Path::new("/"));
    let ran = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| RunError::Preflight(format!("{}: {e}; {hint}", path.display())))?;
    if !ran.status.success() {
        return Err(RunError::Preflight(format!(
            "bubblewrap cannot set up a sandbox on this machine ({}): {} — unprivileged user namespaces may be off (sysctl kernel.unprivileged_userns_clone=1, or user.max_user_namespaces > 0), {hint}",
            ran.status,
            String::from_utf8_lossy(&ran.stderr).trim()
        )));
    }
    Ok(Bubblewrap {
        path,
        version,
        limits: None,
        tmp_bytes: 0,
        disk_bytes: 0,
        user,
    })
}

/// Whether bubblewrap sets up this run's kind of sandbox here: `Ok("bubblewrap 0.8.0 sets up a
/// sandbox; agents as host uid 65534:65534")`, or the pre-flight's words (for `floe doctor`).
pub fn works() -> Result<String, String> {
    let b = check(floe_sandbox::sandbox_user::DEFAULT).map_err(|e| e.to_string())?;
    Ok(format!("{} sets up a sandbox; {}", b.version, agents(&b)))
}

/// Whom the agents are on the host: a root run's sandbox user, or `floe run`'s own.
fn agents(b: &Bubblewrap) -> String {
    match &b.user {
        Some(user) => format!("agents as host uid {}:{}", user.uid, user.gid),
        None => format!("agents as floe run's user (uid {})", nix::unistd::geteuid()),
    }
}

fn floe_binary() -> Result<PathBuf, RunError> {
    std::env::current_exe().map_err(|e| RunError::Io(format!("the floe binary's path: {e}")))
}

/// Where `program` is, looked up as `execvp` would from `floe run`'s own `PATH`.
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").ok();
    floe_sandbox::confine::resolve_program(program, Path::new("/"), path.as_deref())
}

/// The runner of one local session: in its slot of `--out`, against the run's gateway
/// (`(url, control token)`), confined so (`None`: `--no-sandbox`).
pub fn runner_config(
    slot: &Path,
    session: String,
    (gateway_url, control_token): (&str, &str),
    confinement: Option<Confinement>,
    args: &super::RunArgs,
) -> floe_sandbox::runner::RunnerConfig {
    floe_sandbox::runner::RunnerConfig {
        gateway_url: gateway_url.to_string(),
        control_token: control_token.to_string(),
        workspace: slot.join("workspace"),
        state_dir: slot.join("state"),
        pool_prepare: vec![],
        assignment_wait: Some(Duration::from_secs(30)),
        session: Some(session),
        ship_wait: Duration::from_secs(300),
        log_cap_bytes: 1024 * 1024,
        kill_grace: Duration::from_secs(5),
        confinement,
        agent: None,
        // Its own network namespace reaches only the gateway ([`confinement`]).
        egress_check: None,
        disk_budget: (args.limits.session_disk > 0).then_some(args.limits.session_disk),
        swebench: args
            .swebench_python
            .clone()
            .map(floe_sandbox::swebench_grade::Bridge::Python),
        eval_dir: None,
        seeded_from: None,
    }
}

/// `--out/sessions`, made mode 0700: everything an agent can write lies below it, and a program
/// it left set-user-id (it runs as this user, or in a root run as the sandbox's host user) must
/// be out of other users' reach for as long as `--out` keeps it.
pub fn sessions_dir(out: &Path) -> std::io::Result<()> {
    let sessions = out.join("sessions");
    std::fs::create_dir_all(&sessions)?;
    if floe_sandbox::disk_budget::is_memory(&sessions) {
        eprintln!(
            "floe run: --out {} is memory (tmpfs): every session's workspace and copies stay \
             there until the run ends, and an agent's files are memory its cgroup cannot \
             reclaim without swap; put --out on a disk",
            out.display()
        );
    }
    std::fs::set_permissions(
        &sessions,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
}

/// The paths of this run that no agent may see, canonical (bubblewrap mounts over real paths).
pub struct Private {
    pub out: PathBuf,
    pub job: PathBuf,
    /// The JSONL task files (the job's tasks and its held-out tasks).
    pub task_files: Vec<PathBuf>,
    /// The repositories tasks check out (SWE-bench instances' local checkouts): their history
    /// and working tree hold the fix.
    pub repositories: Vec<PathBuf>,
}

/// The confinement every session of this run gets: the run's private paths hidden, the model
/// API reachable through the gateway's unix socket only.
pub fn confinement(
    bwrap: &Bubblewrap,
    private: &Private,
    socket: &Path,
    listen: SocketAddr,
) -> Result<Confinement, RunError> {
    let canonical = |p: &Path| {
        std::fs::canonicalize(p).map_err(|e| RunError::Io(format!("{}: {e}", p.display())))
    };
    let mut hidden = vec![
        Hidden::Dir(canonical(&private.out)?),
        Hidden::File(canonical(&private.job)?),
    ];
    for f in &private.task_files {
        hidden.push(Hidden::File(canonical(f)?));
    }
    for repository in &private.repositories {
        hidden.push(Hidden::Dir(canonical(repository)?));
    }
    let mut anchors = vec![canonical(&private.out)?, canonical(&private.job)?];
    for f in &private.task_files {
        anchors.push(canonical(f)?);
    }
    let homes = super::credentials::homes();
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let keep: Vec<PathBuf> = homes
        .iter()
        .cloned()
        .chain(std::env::current_dir().ok())
        .chain(
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths),
        )
        .collect();
    let named = super::credentials::named_by_environment(&vars, &keep);
    for more in beside_the_run(&anchors)
        .into_iter()
        .chain(super::credentials::credential_stores(
            &homes,
            Path::new("/"),
            &named,
        ))
        // The sandbox has a `/tmp` and `/dev/shm` of its own: nothing there needs hiding, and
        // a mount point there would show the path's name.
        .filter(|h| {
            let (Hidden::Dir(p) | Hidden::File(p)) = h;
            !p.starts_with("/tmp") && !p.starts_with("/dev/shm")
        })
        // A root run's sandbox is set up in a namespace that maps root and the sandbox user
        // only: behind a directory neither may pass (`sudo -E` keeps the invoking user's
        // `SSH_AUTH_SOCK` in `/run/user/1000`, mode 0700), the sandbox cannot reach the path,
        // and bubblewrap could not mount over it.
        .filter(|h| {
            let (Hidden::Dir(p) | Hidden::File(p)) = h;
            bwrap
                .user
                .as_ref()
                .is_none_or(|u| passable(p, u.uid, u.gid))
        })
    {
        if !hidden.contains(&more) {
            hidden.push(more);
        }
    }
    // A root run's sandbox user reaches the gateway's socket (in a directory of this run's,
    // mode 0700) as its owner, and the directories on PATH, `--out` and the tools of the homes
    // through the directories it cannot enter.
    let narrowed = match &bwrap.user {
        Some(user) => {
            std::os::unix::fs::chown(socket, Some(user.uid), Some(user.gid))
                .map_err(|e| RunError::Io(format!("{}: {e}", socket.display())))?;
            // `--out` too: the sessions' workspaces are bound in below it.
            floe_sandbox::sandbox_user::narrowed_here(
                std::env::var("PATH").ok().as_deref(),
                &[canonical(&private.out)?],
                &homes,
                user.uid,
                user.gid,
            )
        }
        None => vec![],
    };
    Ok(Confinement {
        bwrap: bwrap.path.clone(),
        hidden,
        gateway: Some(GatewayRoute {
            socket: socket.to_path_buf(),
            listen,
        }),
        floe: floe_binary()?,
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        user: bwrap.user.clone(),
        narrowed,
        limits: bwrap.limits.clone().and_then(Result::ok),
        tmp_bytes: bwrap.tmp_bytes,
    })
}

/// Whether every directory above `path` lets the set-up of a root run's sandbox pass: owned
/// by root or the sandbox's user (`uid`/`gid`), mapped in its namespace, or searchable by that
/// user.
fn passable(path: &Path, uid: u32, gid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    path.ancestors().skip(1).all(|dir| {
        std::fs::metadata(dir).is_ok_and(|m| {
            m.uid() == 0
                || m.uid() == uid
                || floe_sandbox::sandbox_user::searchable(m.uid(), m.gid(), m.mode(), uid, gid)
        })
    })
}

/// What else on the host holds this run's secrets, beside the paths [`Private`] names (each
/// canonical; `anchors[0]` is `--out`):
/// - the git metadata of every repository holding one of them: when the job or its tasks are
///   committed, the history has the hidden tests, and `git log -p` in a workspace with no
///   repository of its own walks up to it (a `.git` file, a worktree's or a submodule's, and
///   the directory it points to);
/// - earlier runs' outputs beside `--out` (a `run.json` in them): their captures and
///   assignments hold the same hidden tests, as `examples/learn/evaluate.sh`'s second run
///   beside its training run would show them.
pub fn beside_the_run(anchors: &[PathBuf]) -> Vec<Hidden> {
    let mut found: Vec<Hidden> = Vec::new();
    let mut add = |h: Hidden| {
        if !found.contains(&h) {
            found.push(h);
        }
    };
    for anchor in anchors {
        for dir in anchor.ancestors().skip(1) {
            let git = dir.join(".git");
            if git.is_dir() {
                add(Hidden::Dir(git));
            } else if git.is_file() {
                let target = std::fs::read_to_string(&git).ok().and_then(|text| {
                    let to = PathBuf::from(text.trim().strip_prefix("gitdir:")?.trim());
                    std::fs::canonicalize(dir.join(to)).ok()
                });
                add(Hidden::File(git));
                if let Some(target) = target.filter(|t| t.is_dir()) {
                    // A worktree's objects are in the repository it belongs to.
                    let common = std::fs::read_to_string(target.join("commondir"))
                        .ok()
                        .and_then(|c| std::fs::canonicalize(target.join(c.trim())).ok());
                    add(Hidden::Dir(target));
                    if let Some(common) = common {
                        add(Hidden::Dir(common));
                    }
                }
            }
        }
    }
    if let Some((out, parent)) = anchors.first().and_then(|o| Some((o, o.parent()?))) {
        for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
            let path = entry.path();
            if path != *out && path.join(super::resume::RUN_FILE).is_file() {
                add(Hidden::Dir(path));
            }
        }
    }
    found
}

/// A program that the sandbox cannot see: under `/tmp` (the sandbox has its own) or under a
/// path hidden from it. `Some(why)` for the pre-flight error.
pub fn invisible(program: &Path, private: &Private) -> Option<String> {
    let program = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    let out = std::fs::canonicalize(&private.out).unwrap_or_else(|_| private.out.clone());
    if program.starts_with("/tmp") {
        Some("it is under /tmp, and each sandbox has a /tmp of its own".into())
    } else if program.starts_with(&out) {
        Some("it is under --out, which the sandbox hides".into())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repositories_holding_the_run_and_earlier_runs_beside_it_are_hidden(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let root = std::fs::canonicalize(root.path())?;
        // The job in a repository; --out inside it, beside an earlier run and a plain folder.
        std::fs::create_dir_all(root.join("repo/.git/objects"))?;
        std::fs::create_dir_all(root.join("repo/jobs"))?;
        std::fs::write(root.join("repo/jobs/job.yaml"), "x")?;
        for dir in ["out", "earlier", "notes"] {
            std::fs::create_dir_all(root.join("repo/runs").join(dir))?;
        }
        std::fs::write(root.join("repo/runs/earlier/run.json"), "{}")?;
        // A task file in a worktree of another repository.
        std::fs::create_dir_all(root.join("other/.git/worktrees/wt"))?;
        std::fs::write(root.join("other/.git/worktrees/wt/commondir"), "../..\n")?;
        std::fs::create_dir_all(root.join("wt"))?;
        std::fs::write(root.join("wt/.git"), "gitdir: ../other/.git/worktrees/wt\n")?;
        std::fs::write(root.join("wt/tasks.jsonl"), "{}")?;
        let hidden = beside_the_run(&[
            root.join("repo/runs/out"),
            root.join("repo/jobs/job.yaml"),
            root.join("wt/tasks.jsonl"),
        ]);
        assert_eq!(
            hidden,
            vec![
                Hidden::Dir(root.join("repo/.git")),
                Hidden::File(root.join("wt/.git")),
                Hidden::Dir(root.join("other/.git/worktrees/wt")),
                Hidden::Dir(root.join("other/.git")),
                Hidden::Dir(root.join("repo/runs/earlier")),
            ]
        );
        Ok(())
    }

    /// A root run's set-up passes what root or the sandbox user owns, or what others may
    /// search; not another user's closed directory (as root, the test can make one).
    #[test]
    fn a_root_runs_setup_passes_only_what_its_namespace_may() -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let theirs = dir.path().join("run-user-1000");
        std::fs::create_dir(&theirs)?;
        if std::os::unix::fs::chown(&theirs, Some(1000), Some(1000)).is_err() {
            return Ok(()); // not root: no other user's directory to make
        }
        let socket = theirs.join("ssh");
        std::fs::set_permissions(&theirs, PermissionsExt::from_mode(0o700))?;
        assert!(!passable(&socket, 65534, 65534));
        // The sandbox user's own, or open to others: passed.
        assert!(passable(&socket, 1000, 1000));
        std::fs::set_permissions(&theirs, PermissionsExt::from_mode(0o711))?;
        assert!(passable(&socket, 65534, 65534));
        Ok(())
    }
}
