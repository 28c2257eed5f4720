//! Pods: the harness runs in a container of its own (`agent`), graded from another (`sandbox`)
//! that the agent never ran in. This is the line between them.
//!
//! The agent container's first and only process is `floe agent`: PID 1 of the container's own
//! PID namespace. Before any agent code exists it dials the grader over the pod's loopback;
//! the grader takes the first connection and closes its listener, so the link is the
//! supervisor's alone (nothing else in the pod could have dialled first: the agent container
//! runs nothing else yet, and the gateway is floe's). The grader sends one command; the
//! supervisor runs it, then kills every process left in its namespace and reaps them until it
//! has no child, and only then reports. The report therefore means: the agent is gone, all of
//! it, however it detached. The agent cannot stop that: a PID namespace's init ignores the
//! signals its own namespace sends it, and the supervisor is not dumpable, so the agent can
//! neither trace it nor read its memory or file descriptors.
//!
//! Nor can it slow the supervisor down (its scheduling, priority, affinity or limits, as the
//! same user): the harness starts under [`crate::supervisor_guard`], which needs every thread
//! of the supervisor made before the harness ([`supervisor_runtime`]).
//!
//! The supervisor also keeps the half of the session's disk budget that only the agent's own
//! namespace can see: the files its processes deleted but keep open ([`DiskWatch`]).
//!
//! Wire: one JSON line each way ([`Order`], [`Report`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::disk_budget::{self, Budget, Holder};
use crate::process::{self, CommandSpec, Exit, Finished};

use crate::disk_budget::TERMINATION_LOG;

/// The blocking threads the supervisor's runtime keeps: more than it ever uses at once (its
/// command's two output copies, the disk watch, emptying its namespace).
const SUPERVISOR_BLOCKING_THREADS: usize = 8;

/// The supervisor's runtime: one thread, and its blocking threads all made now and kept for
/// good, so that no thread of the supervisor is made once the harness runs
/// ([`crate::supervisor_guard`] guards the ids below the harness's).
pub fn supervisor_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(SUPERVISOR_BLOCKING_THREADS)
        .thread_keep_alive(Duration::from_secs(365 * 24 * 3600))
        .build()?;
    // Each waits until all are there: the pool makes a thread for each.
    let all = std::sync::Arc::new(std::sync::Barrier::new(SUPERVISOR_BLOCKING_THREADS + 1));
    for _ in 0..SUPERVISOR_BLOCKING_THREADS {
        let all = all.clone();
        runtime.spawn_blocking(move || {
            all.wait();
        });
    }
    all.wait();
    Ok(runtime)
}

/// What the grader tells the supervisor: the one command to run.
#[derive(Debug, Serialize, Deserialize)]
pub struct Order {
    pub run: CommandSpec,
    /// The session's disk budget, when it has one.
    #[serde(default)]
    pub disk: Option<DiskWatch>,
}

/// The disk budget of the command's session, as the agent container sees it. The grader walks
/// the workspace and home itself; the files the agent's processes deleted but keep open are
/// visible only from their own PID namespace, so the supervisor adds those and stops the
/// command, as its timeout would, once the two together pass `bytes`
/// ([`disk_budget::held_exceeded`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DiskWatch {
    /// The workspace and home, at their paths in the agent container.
    pub roots: Vec<std::path::PathBuf>,
    pub bytes: u64,
}

/// What the supervisor answers once the command and everything it started are gone.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub finished: Finished,
    /// Every other process of the agent's PID namespace was killed and reaped (the supervisor
    /// is its init). `false` where it is not: the grader must not trust the container then.
    pub namespace_emptied: bool,
    /// Why the supervisor stopped the command for the order's [`DiskWatch`], when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_disk: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("agent link: {0}")]
    Io(#[from] std::io::Error),
    #[error("agent link: malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("the agent container did not dial the grader within {0:?}")]
    NeverDialled(Duration),
    #[error("the agent container ended without a report")]
    Gone,
    #[error("the agent container gave no report within {0:?}")]
    Silent(Duration),
    #[error("the grader went away before the harness finished")]
    GraderGone,
}

// ---- the grader's side ----

/// The grader's end, bound before anything else runs in the pod.
pub struct GraderEnd {
    listener: TcpListener,
}

/// The grader's end once the supervisor dialled it.
pub struct Linked {
    stream: BufReader<TcpStream>,
}

impl GraderEnd {
    pub async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        Ok(Self {
            listener: TcpListener::bind(addr).await?,
        })
    }

    /// The first connection, within `wait`; the listener closes with it.
    pub async fn accept(self, wait: Duration) -> Result<Linked, LinkError> {
        match tokio::time::timeout(wait, self.listener.accept()).await {
            Ok(Ok((stream, _))) => Ok(Linked {
                stream: BufReader::new(stream),
            }),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(LinkError::NeverDialled(wait)),
        }
    }
}

/// The grader's second and last line, when it ends the command early (a limit it watches):
/// the supervisor stops it as its timeout would, and reports as usual.
const STOP: &str = "stop";

impl Linked {
    /// [`Self::run_until`] with nothing to stop it early.
    pub async fn run(self, spec: &CommandSpec, slack: Duration) -> Result<Report, LinkError> {
        self.run_until(spec, None, slack, std::future::pending::<()>())
            .await
            .map(|(report, _)| report)
    }

    /// Runs `spec` in the agent container, its supervisor keeping `disk`, and waits for its
    /// report: at most the command's own timeout and grace, and `slack` on top. When `stop`
    /// completes first, the command is stopped as by its timeout ([`Exit::TimedOut`]) and
    /// `stop`'s output comes back with the report.
    pub async fn run_until<T>(
        mut self,
        spec: &CommandSpec,
        disk: Option<DiskWatch>,
        slack: Duration,
        stop: impl std::future::Future<Output = T>,
    ) -> Result<(Report, Option<T>), LinkError> {
        let order = Order {
            run: spec.clone(),
            disk,
        };
        let mut line = serde_json::to_vec(&order)?;
        line.push(b'\n');
        self.stream.get_mut().write_all(&line).await?;
        let wait = spec.timeout + spec.kill_grace + slack;
        let deadline = tokio::time::Instant::now() + wait;
        let mut reply = String::new();
        let mut stopped = None;
        let read = tokio::select! {
            read = tokio::time::timeout_at(deadline, self.stream.read_line(&mut reply)) => read,
            why = stop => {
                stopped = Some(why);
                // A supervisor that stopped the command itself may be gone already: its report
                // is still to be read.
                let _ = self.stream.get_mut().write_all(format!("{STOP}\n").as_bytes()).await;
                tokio::time::timeout_at(deadline, self.stream.read_line(&mut reply)).await
            }
        };
        match read {
            Err(_) => Err(LinkError::Silent(wait)),
            Ok(Err(e)) => Err(e.into()),
            Ok(Ok(0)) => Err(LinkError::Gone),
            Ok(Ok(_)) => Ok((serde_json::from_str(&reply)?, stopped)),
        }
    }
}

// ---- the agent container's side ----

/// `floe agent`: dial the grader (retrying for `dial_wait`), run the one command it sends,
/// empty the namespace, report. If the grader goes away first, everything is killed all the
/// same and this returns [`LinkError::GraderGone`].
pub async fn supervise(grader: SocketAddr, dial_wait: Duration) -> Result<(), LinkError> {
    let stream = dial(grader, dial_wait).await?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let Some(line) = lines.next_line().await? else {
        return Err(LinkError::GraderGone);
    };
    let order: Order = serde_json::from_str(&line)?;
    tracing::info!(program = %order.run.program, "running the harness");
    // The grader's next line: `stop` ends the command as its timeout would; EOF or anything
    // else means the grader is gone.
    let grader = async {
        match lines.next_line().await {
            Ok(Some(line)) if line.trim() == STOP => Ended::Stopped,
            _ => Ended::GraderGone,
        }
    };
    let budget = async {
        match order.disk {
            // Every process of the namespace is below its init, orphans included.
            Some(watch) => {
                let budget = Budget {
                    bytes: watch.bytes,
                    entries: disk_budget::MAX_ENTRIES,
                };
                let holder = Holder {
                    root: std::process::id(),
                    cgroup_procs: None,
                };
                let beside = vec![std::path::PathBuf::from(TERMINATION_LOG)];
                Ended::OverDisk(
                    disk_budget::held_exceeded(watch.roots, beside, budget, holder).await,
                )
            }
            None => std::future::pending().await,
        }
    };
    // The termination log alone, budget or not.
    let disk = async {
        tokio::select! {
            ended = budget => ended,
            why = disk_budget::termination_log_outgrown() => Ended::OverDisk(why),
        }
    };
    let stop = async {
        tokio::select! {
            ended = grader => ended,
            ended = disk => ended,
        }
    };
    let mut over_disk = None;
    let finished = match process::run_until_as_init(&order.run, stop).await {
        Ok((_, Some(Ended::GraderGone))) => {
            // The run was ended as by its timeout; nobody is left to report to.
            empty_namespace().await;
            return Err(LinkError::GraderGone);
        }
        Ok((finished, ended)) => {
            if let Some(Ended::OverDisk(why)) = ended {
                tracing::warn!("the harness was stopped: {why}");
                over_disk = Some(why);
                // What it wrote there stays on the node's disk until the pod goes.
                disk_budget::empty_files(&[std::path::PathBuf::from(TERMINATION_LOG)]);
            }
            finished
        }
        Err(e) => Finished {
            exit: Exit::SpawnFailed(e.to_string()),
            elapsed: Duration::ZERO,
            stdout_bytes: 0,
            stderr_bytes: 0,
        },
    };
    let namespace_emptied = empty_namespace().await;
    let mut reply = serde_json::to_vec(&Report {
        finished,
        namespace_emptied,
        over_disk,
    })?;
    reply.push(b'\n');
    write.write_all(&reply).await?;
    write.shutdown().await?;
    Ok(())
}

/// Why the supervisor's command ended before it finished.
enum Ended {
    /// The grader said `stop`.
    Stopped,
    GraderGone,
    /// Past the order's [`DiskWatch`].
    OverDisk(String),
}

async fn dial(grader: SocketAddr, wait: Duration) -> Result<TcpStream, LinkError> {
    let started = Instant::now();
    loop {
        match TcpStream::connect(grader).await {
            Ok(s) => return Ok(s),
            Err(_) if started.elapsed() < wait => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => return Err(LinkError::NeverDialled(wait)),
        }
    }
}

/// As PID 1: every other process of the namespace killed and reaped
/// ([`process::empty_own_namespace`]); `false` when this is not PID 1.
async fn empty_namespace() -> bool {
    tokio::task::spawn_blocking(process::empty_own_namespace)
        .await
        .ok()
        .flatten()
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every blocking task of the supervisor runs on a thread made before its runtime was
    /// returned, after its threads idled past tokio's default keep-alive (10 s): a thread
    /// made after it has a higher id than all of them.
    #[test]
    fn the_supervisor_makes_no_thread_once_its_runtime_is_built() {
        let runtime = supervisor_runtime().expect("runtime");
        let tid = || rustix::thread::gettid().as_raw_nonzero().get();
        let later = std::thread::spawn(tid).join().expect("thread");
        std::thread::sleep(Duration::from_secs(11));
        let seen = runtime.block_on(async {
            let tasks: Vec<_> = (0..40)
                .map(|_| {
                    tokio::task::spawn_blocking(move || {
                        std::thread::sleep(Duration::from_millis(5));
                        tid()
                    })
                })
                .collect();
            let mut seen = Vec::new();
            for t in tasks {
                seen.push(t.await.expect("task"));
            }
            seen
        });
        assert!(seen.iter().all(|t| *t < later), "{seen:?} against {later}");
    }

    fn spec(dir: &std::path::Path, script: &str) -> CommandSpec {
        CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![],
            env_remove: vec![],
            cwd: dir.to_path_buf(),
            stdout: dir.join("out"),
            stderr: dir.join("err"),
            cap_bytes: 1024,
            timeout: Duration::from_secs(10),
            kill_grace: Duration::from_millis(200),
            drop_capabilities: false,
            refuse_adoption: false,
        }
    }

    async fn linked() -> Result<(Linked, tokio::task::JoinHandle<Result<(), LinkError>>), LinkError>
    {
        let end = GraderEnd::bind("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await?;
        let addr = end.listener.local_addr()?;
        let supervisor = tokio::spawn(supervise(addr, Duration::from_secs(5)));
        Ok((end.accept(Duration::from_secs(5)).await?, supervisor))
    }

    #[tokio::test]
    async fn the_supervisor_runs_the_order_and_reports_its_exit() -> Result<(), LinkError> {
        let dir = tempfile::tempdir()?;
        let (link, supervisor) = linked().await?;
        let report = link
            .run(&spec(dir.path(), "echo hi; exit 4"), Duration::from_secs(5))
            .await?;
        assert_eq!(report.finished.exit, Exit::Code(4));
        // Not PID 1 here: the report must not claim an emptied namespace.
        assert!(!report.namespace_emptied);
        assert_eq!(std::fs::read_to_string(dir.path().join("out"))?, "hi\n");
        assert!(matches!(supervisor.await, Ok(Ok(()))));
        Ok(())
    }

    #[tokio::test]
    async fn a_stop_from_the_grader_ends_the_harness_and_still_gets_a_report(
    ) -> Result<(), LinkError> {
        let dir = tempfile::tempdir()?;
        let (link, supervisor) = linked().await?;
        let stop = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "over budget"
        };
        let started = Instant::now();
        let (report, stopped) = link
            .run_until(
                &spec(dir.path(), "sleep 3; touch late"),
                None,
                Duration::from_secs(5),
                stop,
            )
            .await?;
        assert_eq!(report.finished.exit, Exit::TimedOut);
        assert_eq!(stopped, Some("over budget"));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(supervisor.await, Ok(Ok(()))));
        tokio::time::sleep(Duration::from_millis(3200)).await;
        assert!(!dir.path().join("late").exists(), "the harness survived");
        Ok(())
    }

    /// The file a process deleted but keeps open is seen only from the agent's own namespace:
    /// the supervisor adds it to the session's disk budget and stops the command there.
    #[tokio::test]
    async fn the_supervisor_stops_a_command_holding_deleted_files_past_the_budget(
    ) -> Result<(), LinkError> {
        // On disk wherever the tests run (a `/tmp` may be memory, which does not count).
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR"))?;
        let (link, supervisor) = linked().await?;
        let script = "( exec 3>hidden; rm hidden; head -c 4194304 /dev/zero >&3; sleep 8 ); \
                      touch late";
        let watch = DiskWatch {
            roots: vec![dir.path().to_path_buf()],
            bytes: 1 << 20,
        };
        let started = Instant::now();
        let (report, stopped) = link
            .run_until(
                &spec(dir.path(), script),
                Some(watch),
                Duration::from_secs(5),
                std::future::pending::<()>(),
            )
            .await?;
        assert_eq!(report.finished.exit, Exit::TimedOut);
        assert_eq!(stopped, None, "the grader never asked");
        let why = report.over_disk.unwrap_or_default();
        assert!(why.contains("deleted but still open"), "{why}");
        assert!(
            started.elapsed() < Duration::from_secs(7),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(supervisor.await, Ok(Ok(()))));
        assert!(!dir.path().join("late").exists(), "the command went on");
        Ok(())
    }

    #[tokio::test]
    async fn the_listener_takes_one_connection_only() -> Result<(), LinkError> {
        let end = GraderEnd::bind("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await?;
        let addr = end.listener.local_addr()?;
        let _first = TcpStream::connect(addr).await?;
        let _linked = end.accept(Duration::from_secs(5)).await?;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "a second dialler reached the grader"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_grader_that_goes_away_takes_the_harness_with_it() -> Result<(), LinkError> {
        let dir = tempfile::tempdir()?;
        let (link, supervisor) = linked().await?;
        let script = "sleep 1; touch late";
        let order = serde_json::to_vec(&Order {
            run: spec(dir.path(), script),
            disk: None,
        })?;
        let mut stream = link.stream.into_inner();
        stream.write_all(&order).await?;
        stream.write_all(b"\n").await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(stream);
        assert!(matches!(supervisor.await, Ok(Err(LinkError::GraderGone))));
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert!(!dir.path().join("late").exists(), "the harness survived");
        Ok(())
    }

    #[tokio::test]
    async fn no_dialler_is_a_clear_error() -> Result<(), LinkError> {
        let end = GraderEnd::bind("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await?;
        let err = end.accept(Duration::from_millis(100)).await.err();
        assert!(matches!(err, Some(LinkError::NeverDialled(_))), "{err:?}");
        Ok(())
    }
}
