//! Running an evaluator command: in its own sandbox in local mode (bubblewrap, only its
//! directory writable), checked to have started; shared by the grading of every reward source
//! and the SWE-bench baseline run.

use std::path::Path;

use crate::children::{child, startable, tail, RunnerConfig};
use crate::confine::Access;
use crate::disk_budget;
use crate::process;
use crate::relay;

/// The most bytes of a reward or test report file read.
pub(crate) const REPORT_LIMIT: u64 = 16 << 20;

/// An evaluator command, run in its own sandbox (local mode) in a directory.
pub(crate) struct Evaluator<'a> {
    pub program: &'a str,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout_seconds: i32,
    pub cgroup_procs: &'a [std::path::PathBuf],
    /// Bytes its directory may hold while it runs (the session's disk budget: the code under
    /// test runs in it); past them it is stopped as by its timeout ([`Ran::over_disk`]).
    pub disk_budget: Option<u64>,
}

impl Evaluator<'_> {
    /// Runs it in `dir` (writable, nothing else is): its command spec (where its output went),
    /// how it ended and its stdout as read off the pipe (`Ran`). `Err`: it could not start
    /// (floe's side or the job's).
    pub async fn run(self, config: &RunnerConfig, name: &str, dir: &Path) -> Result<Ran, String> {
        let mut evaluator = child(
            config,
            name,
            self.program,
            self.args,
            self.env,
            dir,
            self.timeout_seconds,
        );
        // Its whole report, when the report is its stdout: the summary is at the end.
        evaluator.cap_bytes = REPORT_LIMIT;
        // A root grader's (a SWE-bench pod's) capabilities are its own: the code under test
        // is root over root's files and nothing more. Its prepare steps, the job's, keep them.
        evaluator.drop_capabilities = config.agent.as_ref().is_some_and(|a| a.user.is_some());
        if config.agent.is_none() {
            crate::children::drop_users_credentials(&mut evaluator);
        }
        // Its init (the runner, in a pod) counts what the code under test leaves behind: no
        // process of that code's may become a child of the evaluator's own, whose shell would
        // reap it unseen. A local sandbox's `floe sandbox-exec` refuses it with the rest.
        evaluator.refuse_adoption = config.confinement.is_none();
        // A program that is not there is the job's (or the image's), not the code's: said here,
        // so that an exit code the code under test can also produce (127) is never taken for it.
        startable(&evaluator).map_err(|e| format!("the evaluator did not start: {e}"))?;
        if let Some(confinement) = &config.confinement {
            // It runs as the root run's sandbox user, who must be able to write there.
            confinement.hand_over(&[dir])?;
            // Its own namespaces too: the agent's code it runs (tests import it) reaches neither
            // the network nor any other session, and whatever it starts dies with the namespace
            // before the reward is read.
            let access = Access {
                writable: vec![dir],
                read_only: vec![],
                model_api: false,
                cgroup_procs: self.cgroup_procs.to_vec(),
            };
            evaluator = confinement.wrap(evaluator, &access);
        }
        let roots = vec![dir.to_path_buf()];
        let cgroup_procs = self.cgroup_procs.first().cloned();
        let disk_budget = self.disk_budget;
        let (ran, over_disk, stdout) = process::run_kept_watching(&evaluator, |root| {
            let holder = disk_budget::Holder { root, cgroup_procs };
            async move {
                // In a pod the code under test can write the grader's termination log too.
                tokio::select! {
                    why = disk_budget::watch(roots, disk_budget, Some(holder)) => why,
                    why = disk_budget::termination_log_outgrown() => why,
                }
            }
        })
        .await
        .map_err(|e| e.to_string())?;
        if config.confinement.is_some() && !sandbox_started(&evaluator.stderr) {
            return Err(format!(
                "the {name}'s sandbox did not start ({:?}): {}",
                ran.exit,
                tail(&evaluator.stderr, 500)
            ));
        }
        Ok(Ran {
            stdout: String::from_utf8_lossy(&stdout).trim().to_string(),
            spec: evaluator,
            finished: ran,
            over_disk,
        })
    }
}

/// An evaluator's run.
pub(crate) struct Ran {
    /// Where its output went (the logs people read).
    pub spec: process::CommandSpec,
    pub finished: process::Finished,
    /// Its stdout as the runner read it off the pipe (at most [`REPORT_LIMIT`] bytes, trimmed):
    /// what a verdict is read from. The log file can be rewritten by what the evaluator ran
    /// (in a pod it runs as the runner's own user); these bytes cannot.
    pub stdout: String,
    /// Stopped because its directory outgrew the disk budget: what it held.
    pub over_disk: Option<String>,
}

/// Whether `floe sandbox-exec` announced the command started: its line comes first on stderr,
/// before anything the command writes, and nothing can take back bytes from a pipe. Without
/// it, `bwrap` failed to set the sandbox up (floe's side, not the code's).
fn sandbox_started(stderr: &Path) -> bool {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(stderr)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    head[..n]
        .split(|b| *b == b'\n')
        .any(|line| line == relay::STARTED.as_bytes())
}
