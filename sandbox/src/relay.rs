//! `floe sandbox-relay`: the first process inside a local-mode harness sandbox
//! ([`crate::confine`]). The sandbox has its own network namespace with only a loopback
//! device, so the gateway's loopback address does not exist there; the relay listens on that
//! same address inside and forwards every connection to the gateway's unix socket, bound in.
//! Then it runs the harness and exits with its status. The harness needs no other setting:
//! its `*_BASE_URL` is the address it would have used anyway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitStatus;

use tokio::net::{TcpListener, UnixStream};

/// Exit status when the harness cannot be started (as a shell says "command not found").
pub const NOT_STARTED: i32 = 127;

pub struct RelayArgs {
    pub listen: SocketAddr,
    pub socket: PathBuf,
    pub program: String,
    pub args: Vec<String>,
}

/// Runs until the harness exits; returns the exit code to leave with.
pub async fn run(relay: RelayArgs) -> i32 {
    let listener = match TcpListener::bind(relay.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("floe sandbox-relay: cannot listen on {}: {e}", relay.listen);
            return NOT_STARTED;
        }
    };
    // The harness inherits stdio, environment and working directory: the relay is invisible.
    let mut harness = match tokio::process::Command::new(&relay.program)
        .args(&relay.args)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("floe sandbox-relay: cannot start {}: {e}", relay.program);
            return NOT_STARTED;
        }
    };
    loop {
        tokio::select! {
            status = harness.wait() => {
                return match status {
                    Ok(s) => exit_code(s),
                    Err(e) => {
                        eprintln!("floe sandbox-relay: waiting for {}: {e}", relay.program);
                        NOT_STARTED
                    }
                };
            }
            accepted = listener.accept() => {
                let Ok((mut client, _)) = accepted else { continue };
                let socket = relay.socket.clone();
                tokio::spawn(async move {
                    match UnixStream::connect(&socket).await {
                        Ok(mut gateway) => {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut gateway).await;
                        }
                        Err(e) => eprintln!(
                            "floe sandbox-relay: the gateway ({}) refused a connection: {e}",
                            socket.display()
                        ),
                    }
                });
            }
        }
    }
}

/// A shell's convention: the code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(NOT_STARTED)
}
