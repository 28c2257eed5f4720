//! Run one command (a prepare step, the harness, the evaluator) in its own process group under
//! a timeout. On timeout the whole group gets SIGTERM, then SIGKILL after a grace period; after
//! any exit — or when the run is cancelled — everything the command started is killed: its
//! process group, and every process carrying the run's tag in its environment
//! (`FLOE_PROCESS_TAG`), which catches what left the group (Node's `detached` children, daemons
//! that `setsid`). stdout/stderr go to files, each capped (the rest is counted, not kept).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    /// Set on top of the runner's environment.
    pub env: Vec<(String, String)>,
    /// Removed from the runner's environment (e.g. the runner's own credentials); names need
    /// not be UTF-8, as the environment's need not.
    pub env_remove: Vec<std::ffi::OsString>,
    pub cwd: PathBuf,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// Bytes kept per stream.
    pub cap_bytes: u64,
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL on timeout.
    pub kill_grace: Duration,
    /// Start it with no capability in any set, the bounding one included, so that a program
    /// a root runner starts (a SWE-bench pod's eval script, the agent's code in it) is root
    /// over root's files and nothing more. Needs `CAP_SETPCAP`.
    #[serde(default)]
    pub drop_capabilities: bool,
    /// Start it under [`crate::syscall_filter::no_adoption`] (where this process has
    /// `no_new_privs`): a pod's evaluator, whose leftovers its init counts.
    #[serde(default)]
    pub refuse_adoption: bool,
}

/// Starts `command` from a thread of its own that first runs `prepare` on itself: what a
/// thread holds (capabilities, a seccomp filter) a child forked from it starts with, while
/// the runner keeps its own. The thread ends once the child is started.
fn spawn_from_thread(
    command: &mut tokio::process::Command,
    prepare: impl FnOnce() -> std::io::Result<()> + Send,
) -> std::io::Result<tokio::process::Child> {
    let runtime = tokio::runtime::Handle::current();
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                prepare()?;
                // The child is registered with the runtime's reaper from this thread.
                let _entered = runtime.enter();
                command.spawn()
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the spawning thread panicked")))
    })
}

/// What the command's spawning thread does first: give up every capability it could pass on
/// ([`CommandSpec::drop_capabilities`]), and, for a harness under its supervisor (this
/// process its namespace's init), install [`crate::supervisor_guard`].
fn spawn(
    command: &mut tokio::process::Command,
    drop_capabilities: bool,
    guard_supervisor: bool,
    refuse_adoption: bool,
) -> std::io::Result<tokio::process::Child> {
    if !drop_capabilities && !guard_supervisor && !refuse_adoption {
        return command.spawn();
    }
    spawn_from_thread(command, || {
        if drop_capabilities {
            drop_all_capabilities()?;
        }
        if guard_supervisor {
            crate::supervisor_guard::install_for_next_child()?;
        }
        if refuse_adoption {
            let filters = crate::syscall_filter::no_adoption().map_err(std::io::Error::other)?;
            crate::syscall_filter::apply_each(&filters)?;
        }
        Ok(())
    })
}

/// Whether [`crate::supervisor_guard`] can be installed (this process has `no_new_privs`);
/// said once when it cannot.
fn guard_available() -> bool {
    static SAID: std::sync::Once = std::sync::Once::new();
    let available = crate::supervisor_guard::available();
    if !available {
        SAID.call_once(|| {
            tracing::warn!(
                "no_new_privs is off (the template allows privilege escalation): the harness \
                 may change its supervisor's scheduling (docs/security.md)"
            )
        });
    }
    available
}

/// This thread's bounding, ambient and inheritable sets emptied: what a root `execve` from it
/// would give the new program.
fn drop_all_capabilities() -> std::io::Result<()> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    for cap in CapabilitySet::all().iter() {
        if rustix::thread::capability_is_in_bounding_set(cap) == Ok(true) {
            rustix::thread::remove_capability_from_bounding_set(cap)?;
        }
    }
    rustix::thread::clear_ambient_capability_set()?;
    // A root `execve` gains the inheritable set too; the bounding set no longer has any.
    let now = rustix::thread::capabilities(None)?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            inheritable: CapabilitySet::empty(),
            ..now
        },
    )?;
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Exit {
    Code(i32),
    /// Killed by a signal it did not get from us.
    Signal(i32),
    /// Our timeout fired and the group was killed.
    TimedOut,
    /// It never started (missing binary, not executable, bad cwd).
    SpawnFailed(String),
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Finished {
    pub exit: Exit,
    pub elapsed: Duration,
    /// Total bytes written to each stream (kept or not).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

impl Finished {
    pub fn success(&self) -> bool {
        self.exit == Exit::Code(0)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot create output file {path}: {source}")]
pub struct OutputError {
    path: PathBuf,
    source: std::io::Error,
}

pub async fn run(spec: &CommandSpec) -> Result<Finished, OutputError> {
    run_until(spec, std::future::pending::<()>())
        .await
        .map(|(finished, _)| finished)
}

/// [`run_kept`], ended early as [`run_watching`] is.
pub async fn run_kept_watching<T, F>(
    spec: &CommandSpec,
    stop: impl FnOnce(u32) -> F,
) -> Result<(Finished, Option<T>, Vec<u8>), OutputError>
where
    F: std::future::Future<Output = T>,
{
    run_inner(spec, Started(stop), true, Leftovers::Tagged).await
}

/// [`run_until`] with a `stop` made from the command's process id once it started (a limit
/// that watches what the command's processes hold).
pub async fn run_watching<T, F>(
    spec: &CommandSpec,
    stop: impl FnOnce(u32) -> F,
) -> Result<(Finished, Option<T>), OutputError>
where
    F: std::future::Future<Output = T>,
{
    run_inner(spec, Started(stop), false, Leftovers::Tagged)
        .await
        .map(|(finished, stopped, _)| (finished, stopped))
}

/// [`run`], and the stdout it kept (the same bytes as its file) as read off the pipe. A verdict
/// is read from these: the file is a log for people, and whatever the command ran (the code
/// under test, as the runner's own user in a pod) could rewrite it once written.
pub async fn run_kept(spec: &CommandSpec) -> Result<(Finished, Vec<u8>), OutputError> {
    run_inner(
        spec,
        Ready(std::future::pending::<()>()),
        true,
        Leftovers::Tagged,
    )
    .await
    .map(|(finished, _, kept)| (finished, kept))
}

/// [`run`], ended early as by its timeout when `stop` completes first (a limit the caller
/// watches): then [`Exit::TimedOut`] and `stop`'s output.
pub async fn run_until<T>(
    spec: &CommandSpec,
    stop: impl std::future::Future<Output = T>,
) -> Result<(Finished, Option<T>), OutputError> {
    run_inner(spec, Ready(stop), false, Leftovers::Tagged)
        .await
        .map(|(finished, stopped, _)| (finished, stopped))
}

/// [`run_until`] by a PID namespace's init whose every other process is the command's (a pod's
/// agent supervisor): once the command ends, they are all killed at once, before any walk of
/// `/proc`, which hundreds of processes left busy, each with a large environment, could
/// stretch past the grader's deadline. Anywhere else (a grader, whose leftovers it must see
/// itself; `floe run` as a container's PID 1) it is [`run_until`].
pub async fn run_until_as_init<T>(
    spec: &CommandSpec,
    stop: impl std::future::Future<Output = T>,
) -> Result<(Finished, Option<T>), OutputError> {
    run_inner(spec, Ready(stop), false, Leftovers::WholeNamespace)
        .await
        .map(|(finished, stopped, _)| (finished, stopped))
}

/// How what a command left running is found and killed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leftovers {
    /// By the tag in their environment ([`kill_tagged`]).
    Tagged,
    /// Every other process of this namespace, when this is its init ([`empty_own_namespace`]).
    WholeNamespace,
}

/// What ends a run early: a future made before it, or one made from its process id.
trait Stop {
    type Output;
    fn start(self, pid: Option<u32>) -> impl std::future::Future<Output = Self::Output>;
}

struct Ready<F>(F);

impl<F: std::future::Future> Stop for Ready<F> {
    type Output = F::Output;
    fn start(self, _: Option<u32>) -> impl std::future::Future<Output = F::Output> {
        self.0
    }
}

struct Started<C>(C);

impl<C, F> Stop for Started<C>
where
    C: FnOnce(u32) -> F,
    F: std::future::Future,
{
    type Output = F::Output;
    fn start(self, pid: Option<u32>) -> impl std::future::Future<Output = F::Output> {
        let stop = pid.map(self.0);
        async move {
            match stop {
                Some(stop) => stop.await,
                // A child without a pid has already been reaped: nothing to watch.
                None => std::future::pending().await,
            }
        }
    }
}

async fn run_inner<S: Stop>(
    spec: &CommandSpec,
    stop: S,
    keep_stdout: bool,
    leftovers: Leftovers,
) -> Result<(Finished, Option<S::Output>, Vec<u8>), OutputError> {
    let open = |path: &PathBuf| {
        std::fs::File::create(path)
            .map(tokio::fs::File::from_std)
            .map_err(|source| OutputError {
                path: path.clone(),
                source,
            })
    };
    let (out_file, err_file) = (open(&spec.stdout)?, open(&spec.stderr)?);
    let started = Instant::now();
    let mut command = tokio::process::Command::new(&spec.program);
    command
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for key in &spec.env_remove {
        command.env_remove(key);
    }
    command.envs(spec.env.iter().map(|(k, v)| (k, v)));
    let tag = new_tag();
    command.env(TAG_VAR, &tag);
    let guard_supervisor = leftovers == Leftovers::WholeNamespace && guard_available();
    let refuse_adoption = spec.refuse_adoption && crate::supervisor_guard::available();
    let spawned = spawn(
        &mut command,
        spec.drop_capabilities,
        guard_supervisor,
        refuse_adoption,
    );
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let finished = Finished {
                exit: Exit::SpawnFailed(format!("{}: {e}", spec.program)),
                elapsed: started.elapsed(),
                stdout_bytes: 0,
                stderr_bytes: 0,
            };
            return Ok((finished, None, Vec::new()));
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let stop = stop.start(child.id());
    // If this future is dropped (the session is cancelled), everything it started dies with it.
    let _guard = Cleanup {
        group,
        tag: tag.clone(),
    };
    let out = child
        .stdout
        .take()
        .map(|s| tokio::spawn(copy_capped(s, out_file, spec.cap_bytes, keep_stdout)));
    let err = child
        .stderr
        .take()
        .map(|s| tokio::spawn(copy_capped(s, err_file, spec.cap_bytes, false)));

    let mut stopped = None;
    let waited = tokio::select! {
        waited = tokio::time::timeout(spec.timeout, child.wait()) => waited,
        why = stop => {
            stopped = Some(why);
            Ok(Err(std::io::Error::other("stopped")))
        }
    };
    let exit = match waited {
        Ok(Ok(status)) => status_exit(status),
        Ok(Err(_)) if stopped.is_some() => {
            end_group(&mut child, group, spec.kill_grace).await;
            Exit::TimedOut
        }
        Ok(Err(e)) => Exit::SpawnFailed(format!("waiting for {}: {e}", spec.program)),
        Err(_) => {
            end_group(&mut child, group, spec.kill_grace).await;
            Exit::TimedOut
        }
    };
    // Whatever the command left running (servers, watchers, detached children) dies with it.
    signal_group(group, Signal::SIGKILL);
    if leftovers != Leftovers::WholeNamespace || empty_own_namespace().is_none() {
        kill_tagged(&tag);
    }
    let drained = |task: Option<tokio::task::JoinHandle<Copied>>| async move {
        match task {
            Some(t) => tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            None => Copied::default(),
        }
    };
    let stdout = drained(out).await;
    let stderr_bytes = drained(err).await.total;
    let finished = Finished {
        exit,
        elapsed: started.elapsed(),
        stdout_bytes: stdout.total,
        stderr_bytes,
    };
    Ok((finished, stopped, stdout.kept))
}

/// What [`copy_capped`] moved: every byte counted, those kept when asked.
#[derive(Default)]
struct Copied {
    total: u64,
    kept: Vec<u8>,
}

/// SIGTERM to the command's group, SIGKILL after `grace`; returns once the command is reaped.
async fn end_group(child: &mut tokio::process::Child, group: Option<Pid>, grace: Duration) {
    signal_group(group, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        signal_group(group, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// The processes of this PID namespace but this one (their PIDs, from `/proc`).
pub fn other_processes() -> std::collections::BTreeSet<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| *pid != me)
        .collect()
}

/// `cmd`'s output, with `input` written to its stdin while its output is read (so neither
/// side waits on a full pipe); its stdin is closed after. `cmd` must pipe stdin and whatever
/// output is wanted; it is killed if this future is dropped.
pub async fn output_with_input(
    mut cmd: tokio::process::Command,
    input: Vec<u8>,
) -> std::io::Result<std::process::Output> {
    let mut child = cmd.kill_on_drop(true).spawn()?;
    let mut stdin = child.stdin.take();
    let write = async move {
        if let Some(stdin) = stdin.as_mut() {
            // A child that exits without reading all of it is answered by its exit status.
            let _ = stdin.write_all(&input).await;
        }
        drop(stdin);
    };
    let (_, out) = tokio::join!(write, child.wait_with_output());
    out
}

/// As PID 1 of a PID namespace (a container's init): SIGKILL every other process of it and
/// reap until there is no child left; returns the processes there were besides this one.
/// Every process of a PID namespace descends from its init, and orphans are re-parented to it,
/// so "no child" means "nobody else". `None` when this is not PID 1 (a test, a pod sharing its
/// process namespace): nothing is touched.
pub fn empty_own_namespace() -> Option<std::collections::BTreeSet<u32>> {
    use nix::errno::Errno;
    use nix::sys::wait::waitpid;
    if std::process::id() != 1 {
        return None;
    }
    let others = other_processes();
    loop {
        // kill(-1) from init reaches every process of its namespace but itself.
        let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
        match waitpid(None::<Pid>, None) {
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return Some(others), // ECHILD: nobody is left
        }
    }
}

/// Environment variable that marks every process a run started, however it detached.
pub const TAG_VAR: &str = "FLOE_PROCESS_TAG";

fn new_tag() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{}-{n}-{nanos}", std::process::id())
}

/// SIGKILL every process whose environment holds `FLOE_PROCESS_TAG=<tag>` (Linux `/proc`;
/// processes of other users are unreadable and skipped). Two passes, for children forked
/// during the first. Returns how many were signalled.
pub fn kill_tagged(tag: &str) -> usize {
    kill_marked(TAG_VAR, tag)
}

/// SIGKILL every process (but this one) whose environment holds `var=value`, twice over.
pub fn kill_marked(var: &str, value: &str) -> usize {
    let mut killed = 0;
    for _ in 0..2 {
        for pid in marked(var, value) {
            if nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
    }
    killed
}

/// Processes (but this one) whose environment holds `var=value`.
fn marked(var: &str, value: &str) -> Vec<i32> {
    let needle = format!("{var}={value}");
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            (pid != me && environ.split(|b| *b == 0).any(|v| v == needle.as_bytes())).then_some(pid)
        })
        .collect()
}

/// Kill every process (but this one) whose environment holds `var=value`, and wait (at most
/// `within`) until none is left: a process sent SIGKILL still runs until the kernel gets to
/// it. Returns how many are left. (A zombie's environment reads empty: it no longer counts.)
pub fn end_marked(var: &str, value: &str, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let left = marked(var, value);
        if left.is_empty() || Instant::now() >= deadline {
            return left.len();
        }
        for pid in left {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Cleanup {
    group: Option<Pid>,
    tag: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        signal_group(self.group, Signal::SIGKILL);
        kill_tagged(&self.tag);
    }
}

fn status_exit(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Code(-1),
    }
}

fn signal_group(group: Option<Pid>, signal: Signal) {
    if let Some(pid) = group {
        // ESRCH (the group is already gone) is the normal case.
        let _ = killpg(pid, signal);
    }
}

/// Copy a stream into a file, keeping the first `cap` bytes; returns the total read.
async fn copy_capped(
    mut from: impl AsyncRead + Unpin,
    mut to: tokio::fs::File,
    cap: u64,
    in_memory: bool,
) -> Copied {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let mut kept = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let keep = cap.saturating_sub(total).min(n as u64) as usize;
        if in_memory {
            kept.extend_from_slice(&buf[..keep]);
        }
        if keep > 0 && to.write_all(&buf[..keep]).await.is_err() {
            break;
        }
        total += n as u64;
    }
    if total > cap {
        let note = format!(
            "\n[floe: output truncated, {} of {total} bytes kept]\n",
            cap
        );
        let _ = to.write_all(note.as_bytes()).await;
    }
    let _ = to.flush().await;
    Copied { total, kept }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_marked_processes_waits_until_they_are_gone() -> std::io::Result<()> {
        let value = format!("test-{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("FLOE_TEST_MARK", &value)
            .spawn()?;
        let pid = i32::try_from(child.id()).unwrap_or_default();
        // Seen once its environment is readable (right after exec).
        let until = Instant::now() + Duration::from_secs(5);
        while !marked("FLOE_TEST_MARK", &value).contains(&pid) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(marked("FLOE_TEST_MARK", &value), [pid]);
        // Killed, not yet reaped: a zombie, which no longer counts.
        assert_eq!(
            end_marked("FLOE_TEST_MARK", &value, Duration::from_secs(5)),
            0
        );
        let status = child.wait()?;
        assert!(!status.success(), "killed, not finished: {status:?}");
        Ok(())
    }

    fn spec(dir: &std::path::Path, script: &str, timeout_ms: u64) -> CommandSpec {
        CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("GREETING".into(), "hi".into())],
            env_remove: vec![],
            cwd: dir.to_path_buf(),
            stdout: dir.join("out"),
            stderr: dir.join("err"),
            cap_bytes: 10,
            timeout: Duration::from_millis(timeout_ms),
            kill_grace: Duration::from_millis(200),
            drop_capabilities: false,
            refuse_adoption: false,
        }
    }

    /// A capability set of `/proc/<pid>/status`, e.g. `CapBnd`.
    fn capabilities(status: &str, set: &str) -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(&format!("{set}:")))?;
        u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
    }

    /// A root runner's child started without capabilities has none in any set (a root
    /// `execve` would otherwise give it the bounding set's), and the runner keeps its own.
    /// Without `CAP_SETPCAP` (not root) the bounding set cannot be emptied: the child does
    /// not start at all, rather than start with more than it should.
    #[tokio::test]
    async fn a_child_started_without_capabilities_has_none_and_the_runner_keeps_its_own(
    ) -> Result<(), Box<dyn std::error::Error>> {
        const SETPCAP: u64 = 1 << 8;
        let ours = std::fs::read_to_string("/proc/self/status")?;
        let ours_before = capabilities(&ours, "CapEff");
        let dir = tempfile::tempdir()?;
        let mut child = spec(dir.path(), "cat /proc/self/status", 5000);
        child.cap_bytes = 1 << 20;
        child.drop_capabilities = true;
        let done = run(&child).await?;
        if ours_before.unwrap_or(0) & SETPCAP == 0 {
            assert!(matches!(done.exit, Exit::SpawnFailed(_)), "{:?}", done.exit);
            return Ok(());
        }
        assert_eq!(done.exit, Exit::Code(0));
        let theirs = std::fs::read_to_string(dir.path().join("out"))?;
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(capabilities(&theirs, set), Some(0), "{set}: {theirs}");
        }
        let ours = std::fs::read_to_string("/proc/self/status")?;
        assert_eq!(capabilities(&ours, "CapEff"), ours_before);
        // And without the flag, a root child has what its runner may give.
        child.drop_capabilities = false;
        run(&child).await?;
        let theirs = std::fs::read_to_string(dir.path().join("out"))?;
        assert_ne!(capabilities(&theirs, "CapBnd"), Some(0), "{theirs}");
        Ok(())
    }

    #[tokio::test]
    async fn exit_code_env_and_capped_output() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let done = run(&spec(
            dir.path(),
            "echo $GREETING-0123456789abcdef; echo oops >&2; exit 3",
            5000,
        ))
        .await?;
        assert_eq!(done.exit, Exit::Code(3));
        assert_eq!(done.stdout_bytes, 20);
        let out = std::fs::read_to_string(dir.path().join("out"))?;
        assert!(out.starts_with("hi-0123456"), "{out}");
        assert!(out.contains("truncated, 10 of 20 bytes kept"), "{out}");
        assert_eq!(std::fs::read_to_string(dir.path().join("err"))?, "oops\n");
        Ok(())
    }

    #[tokio::test]
    async fn the_kept_stdout_is_what_came_off_the_pipe_whatever_the_log_file_says_later(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        // The command rewrites its own log after writing it, as code under test running as the
        // runner's user could: the verdict's bytes are the pipe's.
        let mut s = spec(
            dir.path(),
            "echo '1 failed in 0.1s'; sleep 0.2; echo '1 passed in 0.1s' > out",
            5000,
        );
        s.cap_bytes = 64;
        let (done, kept) = run_kept(&s).await?;
        assert!(done.success());
        assert_eq!(String::from_utf8(kept)?, "1 failed in 0.1s\n");
        let log = std::fs::read_to_string(dir.path().join("out"))?;
        assert!(log.contains("1 passed"), "the file was rewritten: {log}");
        // Kept up to the cap, as the file.
        let (_, kept) = run_kept(&spec(dir.path(), "echo 0123456789abcdef", 5000)).await?;
        assert_eq!(kept, b"0123456789");
        Ok(())
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group_including_background_children(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        // A background grandchild that would write a file after the timeout, and a parent that
        // ignores SIGTERM: both must be gone. (Each `late` waits 3 s, not 1: the kill must come
        // before it, on a machine busy enough to delay a timer by most of a second.)
        let script = "(sleep 3; touch late) & trap '' TERM; sleep 30";
        let done = run(&spec(dir.path(), script, 200)).await?;
        assert_eq!(done.exit, Exit::TimedOut);
        assert!(done.elapsed < Duration::from_secs(5), "{:?}", done.elapsed);
        tokio::time::sleep(Duration::from_millis(3300)).await;
        assert!(!dir.path().join("late").exists(), "a group member survived");
        Ok(())
    }

    #[tokio::test]
    async fn a_stop_ends_the_command_as_its_timeout_would() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let script = "(sleep 3; touch late) & trap '' TERM; sleep 30";
        let stop = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            "over its disk budget"
        };
        let (done, stopped) = run_until(&spec(dir.path(), script, 30_000), stop).await?;
        assert_eq!(done.exit, Exit::TimedOut);
        assert_eq!(stopped, Some("over its disk budget"));
        assert!(done.elapsed < Duration::from_secs(5), "{:?}", done.elapsed);
        tokio::time::sleep(Duration::from_millis(3300)).await;
        assert!(!dir.path().join("late").exists(), "a group member survived");
        // A command that ends first: no stop.
        let (done, stopped) = run_until(
            &spec(dir.path(), "exit 0", 5000),
            std::future::pending::<()>(),
        )
        .await?;
        assert_eq!((done.exit, stopped), (Exit::Code(0), None));
        Ok(())
    }

    #[tokio::test]
    async fn stragglers_die_when_the_command_exits() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let done = run(&spec(dir.path(), "(sleep 3; touch late) & exit 0", 5000)).await?;
        assert!(done.success());
        tokio::time::sleep(Duration::from_millis(3300)).await;
        assert!(!dir.path().join("late").exists());
        Ok(())
    }

    #[tokio::test]
    async fn cancelling_the_run_kills_the_group() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let s = spec(dir.path(), "(sleep 3; touch late) & sleep 30", 60_000);
        let cancelled = tokio::time::timeout(Duration::from_millis(300), run(&s)).await;
        assert!(
            cancelled.is_err(),
            "the command should still have been running"
        );
        tokio::time::sleep(Duration::from_millis(3300)).await;
        assert!(
            !dir.path().join("late").exists(),
            "a group member survived cancellation"
        );
        Ok(())
    }

    #[tokio::test]
    async fn processes_that_left_the_group_die_too() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        // `setsid` puts the child in a new session and process group, like Node's `detached`.
        let s = spec(
            dir.path(),
            "setsid sh -c 'sleep 3; touch late' & exit 0",
            5000,
        );
        assert!(run(&s).await?.success());
        tokio::time::sleep(Duration::from_millis(3300)).await;
        assert!(
            !dir.path().join("late").exists(),
            "a detached child survived"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_missing_binary_is_a_spawn_failure_not_an_exit_code(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut s = spec(dir.path(), "", 1000);
        s.program = "/nonexistent/harness".into();
        assert!(matches!(run(&s).await?.exit, Exit::SpawnFailed(_)));
        Ok(())
    }
}
