//! `floe sandbox-exec`: the first process inside every local-mode sandbox
//! ([`crate::confine`]). It starts the confined command (the harness or the evaluator) under
//! the seccomp filter ([`crate::syscall_filter`]) and exits with its status.
//!
//! For a harness it is also the relay: the sandbox has its own network namespace with only a
//! loopback device, so the gateway's loopback address does not exist there; the relay listens on
//! that same address inside and forwards every connection to the gateway's unix socket, bound
//! in. The harness needs no other setting: its `*_BASE_URL` is the address it would have used
//! anyway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitStatus;

use tokio::net::{TcpListener, UnixStream};

use crate::syscall_filter;

/// Exit status when the command cannot be started (as a shell says "command not found").
pub const NOT_STARTED: i32 = 127;

pub struct ExecArgs {
    /// Relay `listen` (inside) to the gateway's unix `socket`; `None`: no network.
    pub relay: Option<(SocketAddr, PathBuf)>,
    pub program: String,
    pub args: Vec<String>,
}

/// Runs until the command exits; returns the exit code to leave with.
pub async fn run(exec: ExecArgs) -> i32 {
    let listener = match &exec.relay {
        Some((listen, _)) => match TcpListener::bind(listen).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("floe sandbox-exec: cannot listen on {listen}: {e}");
                return NOT_STARTED;
            }
        },
        None => None,
    };
    let filter = match syscall_filter::program() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("floe sandbox-exec: {e}");
            return NOT_STARTED;
        }
    };
    let mut finished = start_filtered(filter, exec.program.clone(), exec.args.clone());
    let socket = exec.relay.map(|(_, socket)| socket);
    loop {
        let accepted = async {
            match &listener {
                Some(l) => l.accept().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = &mut finished => {
                return match status {
                    Ok(Ok(s)) => exit_code(s),
                    Ok(Err(e)) => {
                        eprintln!("floe sandbox-exec: cannot run {}: {e}", exec.program);
                        NOT_STARTED
                    }
                    Err(_) => NOT_STARTED,
                };
            }
            accepted = accepted => {
                let (Ok((mut client, _)), Some(socket)) = (accepted, socket.clone()) else {
                    continue;
                };
                tokio::spawn(async move {
                    match UnixStream::connect(&socket).await {
                        Ok(mut gateway) => {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut gateway).await;
                        }
                        Err(e) => eprintln!(
                            "floe sandbox-exec: the gateway ({}) refused a connection: {e}",
                            socket.display()
                        ),
                    }
                });
            }
        }
    }
}

/// Starts the command from a thread of its own that installed the filter first: a seccomp
/// filter belongs to the thread that installs it and to the processes it starts, so the relay's
/// own threads (which connect to the gateway's unix socket) stay unfiltered. The command
/// inherits stdio, environment and working directory: the relay is invisible.
fn start_filtered(
    filter: seccompiler::BpfProgram,
    program: String,
    args: Vec<String>,
) -> tokio::sync::oneshot::Receiver<std::io::Result<ExitStatus>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let ran = syscall_filter::apply(&filter).and_then(|()| {
            std::process::Command::new(&program)
                .args(&args)
                .spawn()?
                .wait()
        });
        let _ = tx.send(ran);
    });
    rx
}

/// A shell's convention: the code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(NOT_STARTED)
}
