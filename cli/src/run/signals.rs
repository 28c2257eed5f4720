//! How a local run stops when told to, and how what it started stops when the run is killed.
//!
//! - SIGINT (Ctrl-C) and SIGTERM (`timeout`, `docker stop`, systemd, Kubernetes) end a run the
//!   same way: running sessions are cancelled, what was captured is written, the summary too.
//! - SIGKILL cannot be caught, so a run is watched from outside: every process a run starts
//!   inherits `FLOE_RUN_TAG` in its environment, and a small watchdog process (`floe
//!   run-watchdog`, in its own process group so Ctrl-C does not reach it) waits for the run to
//!   end by any means and then kills every process still carrying the tag — harnesses, their
//!   detached children, vLLM and the trainer alike.

use std::os::unix::process::CommandExt as _;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

/// Marks every process of one local run (see the module doc).
pub const RUN_TAG_VAR: &str = "FLOE_RUN_TAG";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
}

impl Stop {
    /// The shell's convention: 128 + the signal's number.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Interrupt => 130,
            Self::Terminate => 143,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
        }
    }
}

/// Listens for SIGINT and SIGTERM from the moment it is made.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    pub async fn recv(&mut self) -> Stop {
        tokio::select! {
            _ = self.interrupt.recv() => Stop::Interrupt,
            _ = self.terminate.recv() => Stop::Terminate,
        }
    }
}

/// Tag this process's environment (inherited by everything it starts from now on) and start
/// the watchdog. Call before the async runtime starts threads.
pub fn watch_this_run() -> std::io::Result<()> {
    let tag = format!(
        "{}-{}",
        std::process::id(),
        hex::encode(rand::random::<[u8; 8]>())
    );
    // No other thread exists yet (the runtime is built after this).
    std::env::set_var(RUN_TAG_VAR, &tag);
    let exe = std::env::current_exe()?;
    std::process::Command::new(exe)
        .args(["run-watchdog", "--parent", &std::process::id().to_string()])
        .args(["--tag", &tag])
        .env_remove(RUN_TAG_VAR)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .map(|_| ())
}

/// Kill every process carrying this run's tag and wait (at most `within`) until they are gone;
/// returns how many are left.
pub fn end_this_runs_processes(within: Duration) -> usize {
    match std::env::var(RUN_TAG_VAR) {
        Ok(tag) => floe_sandbox::process::end_marked(RUN_TAG_VAR, &tag, within),
        Err(_) => 0,
    }
}

/// `floe run-watchdog`: wait until `parent` is gone, then kill what carried its tag.
pub fn watchdog(parent: u32, tag: &str) -> i32 {
    // Reparented (to init or a subreaper) once the run has ended, however it ended.
    while std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_millis(200));
    }
    let killed = floe_sandbox::process::kill_marked(RUN_TAG_VAR, tag);
    // Until none is left (a process forking while it is killed), as the run's own exit does.
    let left = floe_sandbox::process::end_marked(RUN_TAG_VAR, tag, Duration::from_secs(5));
    if killed > 0 {
        eprintln!("floe run-watchdog: the run ended; killed {killed} process(es) it had left");
    }
    if left > 0 {
        eprintln!("floe run-watchdog: {left} process(es) of the run are still alive");
        return 1;
    }
    0
}
