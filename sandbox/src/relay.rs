//! `floe sandbox-exec`: the first process inside every local-mode sandbox
//! ([`crate::confine`]). It starts the confined command (the harness or the evaluator) under
//! the seccomp filter ([`crate::syscall_filter`]) and exits with its status.
//!
//! For a harness it is also the relay: the sandbox has its own network namespace with only a
//! loopback device, so the gateway's loopback address does not exist there; the relay listens on
//! that same address inside and forwards every connection to the gateway's unix socket, bound
//! in. The harness needs no other setting: its `*_BASE_URL` is the address it would have used
//! anyway.
//!
//! The relay runs outside the command's seccomp filter (it must dial a unix socket), in a
//! sandbox whose `/tmp` the agent can rewrite: so it opens the socket once, before the command
//! exists, as an `O_PATH` descriptor that does not follow links, and dials that inode through
//! `/proc/self/fd/N` ever after. Renaming `/tmp/.floe` and planting a link to a host daemon's
//! socket changes nothing it dials. It is not dumpable (the agent, the same user, can neither
//! trace it nor read its memory), and once the command is started it installs a filter of its
//! own that refuses starting programs, tracing and namespace or mount changes.

use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};

use tokio::net::{TcpListener, UnixStream};

use crate::syscall_filter;

/// The line `floe sandbox-exec` writes on stderr just before it starts the command: the runner
/// reads it as "the sandbox was set up" (`bwrap` itself fails before it, with its own message).
pub const STARTED: &str = "floe sandbox-exec: started";

/// The evaluator's exit when its command left a process behind: orphans are re-parented to
/// `floe sandbox-exec` (a child subreaper), so one still alive, or dead but not reaped, when
/// the command exits is a process that left the command's tree (`setsid`, a double fork) and
/// could have rewritten the verdict between the tests and the end. The runner scores that as
/// the policy's failure. The code under test can exit 253 itself: only to its own loss.
pub const STRAGGLERS: i32 = 253;

/// Connections one sandbox may hold through its relay at once; the next waits to be accepted.
/// A harness makes a few calls at a time. The cap is what keeps sandboxes sharing one gateway
/// (`floe run`'s) from starving each other: the gateway has room for every sandbox's whole
/// share, and an agent that takes all of its own only delays its own calls.
pub const MAX_CONNECTIONS: usize = 32;

/// Exit status when the command cannot be started (as a shell says "command not found").
pub const NOT_STARTED: i32 = 127;

pub struct ExecArgs {
    /// Relay `listen` (inside) to the gateway's unix `socket`; `None`: no network.
    pub relay: Option<(SocketAddr, PathBuf)>,
    /// The evaluator: exit [`STRAGGLERS`] if the command left any process behind.
    pub no_stragglers: bool,
    /// In a root run's sandbox: the uid/gid to become before anything else runs
    /// ([`crate::sandbox_user::become_sandbox_user`]).
    pub become_user: Option<(u32, u32)>,
    pub program: String,
    pub args: Vec<String>,
}

/// Runs until the command exits; returns the exit code to leave with.
pub async fn run(exec: ExecArgs) -> i32 {
    // Before anything else: nothing started later may trace this process or read its memory.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("floe sandbox-exec: cannot make this process undumpable: {e}");
        return NOT_STARTED;
    }
    let relay = match &exec.relay {
        Some((listen, socket)) => {
            let listener = match TcpListener::bind(listen).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("floe sandbox-exec: cannot listen on {listen}: {e}");
                    return NOT_STARTED;
                }
            };
            match PinnedSocket::open(socket) {
                Ok(pinned) => Some((listener, pinned)),
                Err(e) => {
                    eprintln!("floe sandbox-exec: {e}");
                    return NOT_STARTED;
                }
            }
        }
        None => None,
    };
    // The listener and the socket are held: from here on this process and all it starts are
    // the sandbox's user, and nothing it inherited past stdio (bubblewrap leaves the run's user
    // namespace open on a descriptor) is passed on.
    // Whatever `floe run` inherited (a make jobserver, a CI log, a launcher's socket) stays
    // out of the command too.
    close_fds::set_fds_cloexec(3, &[]);
    if let Some((uid, gid)) = exec.become_user {
        if let Err(e) = crate::sandbox_user::become_sandbox_user(uid, gid) {
            eprintln!("floe sandbox-exec: cannot become the sandbox's user: {e}");
            return NOT_STARTED;
        }
    }
    let (command, relay_filter) = match (syscall_filter::program(), syscall_filter::relay()) {
        (Ok(c), Ok(r)) => (c, r),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("floe sandbox-exec: {e}");
            return NOT_STARTED;
        }
    };
    if exec.no_stragglers {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            eprintln!("floe sandbox-exec: cannot become a subreaper: {e}");
            return NOT_STARTED;
        }
    }
    eprintln!("{STARTED}");
    let child = match start_filtered(command, &exec.program, &exec.args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("floe sandbox-exec: cannot run {}: {e}", exec.program);
            return NOT_STARTED;
        }
    };
    // The command is started (the only `execve` this process needed): the relay's own filter
    // goes on every thread now.
    if let Err(e) = syscall_filter::apply_all_threads(&relay_filter) {
        eprintln!("floe sandbox-exec: {e}");
        return NOT_STARTED;
    }
    let mut finished = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.wait()
    });
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot first, then the accept: a connection past the cap waits in the backlog.
        let accepted = async {
            match &relay {
                Some((l, _)) => {
                    let slot = slots.clone().acquire_owned().await;
                    l.accept().await.map(|accepted| (accepted, slot))
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = &mut finished => {
                return match status {
                    Ok(Ok(_)) if exec.no_stragglers && left_behind() > 0 => {
                        eprintln!("floe sandbox-exec: the command left processes behind");
                        STRAGGLERS
                    }
                    Ok(Ok(s)) => exit_code(s),
                    Ok(Err(e)) => {
                        eprintln!("floe sandbox-exec: waiting for {}: {e}", exec.program);
                        NOT_STARTED
                    }
                    Err(_) => NOT_STARTED,
                };
            }
            accepted = accepted => {
                let (Ok(((mut client, _), slot)), Some((_, pinned))) = (accepted, &relay) else {
                    continue;
                };
                let dial = pinned.dial_path();
                tokio::spawn(async move {
                    match UnixStream::connect(&dial).await {
                        Ok(mut gateway) => {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut gateway).await;
                        }
                        Err(e) => eprintln!("floe sandbox-exec: the gateway refused a connection: {e}"),
                    }
                    drop(slot);
                });
            }
        }
    }
}

/// The gateway's socket, opened once as an `O_PATH` descriptor: dialled through
/// `/proc/self/fd/N`, so the inode, not whatever the path names later.
struct PinnedSocket {
    fd: std::fs::File,
}

impl PinnedSocket {
    fn open(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| format!("the gateway's socket {}: {e}", path.display()))?;
        let kind = fd
            .metadata()
            .map_err(|e| format!("the gateway's socket {}: {e}", path.display()))?
            .file_type();
        if !kind.is_socket() {
            return Err(format!(
                "{} is not a socket (a link or a file planted there?)",
                path.display()
            ));
        }
        Ok(Self { fd })
    }

    fn dial_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// Starts the command from a thread of its own that installed the filter first: a seccomp
/// filter belongs to the thread that installs it and to the processes it starts, so the relay's
/// own threads (which connect to the gateway's unix socket) stay unfiltered. The thread ends
/// once the command is started (the relay's filter is then synchronised onto every thread,
/// which a thread holding another filter would refuse). The command inherits stdio,
/// environment and working directory: the relay is invisible.
fn start_filtered(
    filters: Vec<seccompiler::BpfProgram>,
    program: &str,
    args: &[String],
) -> std::io::Result<Child> {
    let (program, args) = (program.to_string(), args.to_vec());
    std::thread::spawn(move || {
        syscall_filter::apply_each(&filters)?;
        std::process::Command::new(&program).args(&args).spawn()
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("the starting thread panicked")))
}

/// How many processes are this one's children now that the command is reaped (orphans it
/// adopted as init or subreaper, alive or zombie). Each is killed: the namespace dies with
/// this process anyway, this only makes it certain. Fails closed: what cannot be read (the
/// evaluated code lowered this process's file limit, say) counts as left behind.
fn left_behind() -> usize {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return usize::MAX;
    };
    let mut found = 0;
    for entry in entries {
        let Ok(entry) = entry else {
            return usize::MAX;
        };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let stat = match std::fs::read_to_string(entry.path().join("stat")) {
            Ok(s) => s,
            // Gone since the listing: not left behind.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return usize::MAX,
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        if ppid == Some(me.as_str()) {
            found += 1;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    found
}

/// A shell's convention: the code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(NOT_STARTED)
}
