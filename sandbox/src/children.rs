//! What the runner is told ([`RunnerConfig`]) and how it starts its children: the command
//! specs of prepare steps, the harness and the evaluator, with their logs, and reading those
//! logs back. Shared by [`crate::runner`] and [`crate::grading`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floe_crds::common::PrepareStep;

use crate::confine::{self, Confinement};
use crate::process::CommandSpec;

/// Variables of the runner that the harness and evaluator never see.
const PRIVATE_ENV: &[&str] = &[
    "FLOE_CONTROL_TOKEN",
    "FLOE_CONTROL_TOKEN_FILE",
    floe_gateway::bearer::UPSTREAM_KEY_ENV,
];

/// Whether a variable of the machine `floe run` runs on looks like a credential (a token, a
/// key, a password, a cloud's credentials, an ssh agent): a local harness does not inherit it.
/// The agent has no network but its model API, yet what it reads it can write into its
/// trajectory, and an RL run would learn to. A job that means a harness to have one names it
/// in `harness.env`, which is set after this removal.
pub(crate) fn credential_like(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    const SUFFIXES: &[&str] = &[
        "TOKEN",
        "SECRET",
        "SECRET_KEY",
        "ACCESS_KEY",
        "API_KEY",
        "APIKEY",
        "PASSWORD",
        "PASSWD",
        "CREDENTIALS",
        // An exporter's request headers (`OTEL_EXPORTER_OTLP_HEADERS=api-key=…`): an API key
        // or an `Authorization` header, as often as not.
        "_HEADERS",
    ];
    const PREFIXES: &[&str] = &["AWS_", "AZURE_", "GOOGLE_APPLICATION_CREDENTIALS"];
    const NAMES: &[&str] = &["KUBECONFIG", "SSH_AUTH_SOCK", "DOCKER_AUTH_CONFIG"];
    SUFFIXES.iter().any(|s| n.ends_with(s))
        || PREFIXES.iter().any(|p| n.starts_with(p))
        || NAMES.contains(&n.as_str())
}

/// Whether a variable's value holds a URL with credentials in it (`https://user:pass@host/`,
/// `https://TOKEN@host/`): a package index's or a repository's, under a name
/// [`credential_like`] cannot tell (`PIP_INDEX_URL`, `UV_EXTRA_INDEX_URL`, `npm_config_registry`).
pub(crate) fn holds_url_credentials(value: &str) -> bool {
    value.match_indices("://").any(|(at, sep)| {
        let authority = value[at + sep.len()..]
            .split(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .next()
            .unwrap_or("");
        authority.find('@').is_some_and(|user_end| user_end > 0)
    })
}

/// Whether a URL in the value carries a secret in its query string: a signed URL's
/// (`X-Amz-Signature`, `X-Goog-Signature`, an Azure SAS's `sig`), or a token or key passed
/// as a parameter (`?access_token=…`, `?api_key=…`), with a value.
pub(crate) fn holds_query_secret(value: &str) -> bool {
    const PARTS: &[&str] = &[
        "token",
        "secret",
        "password",
        "passwd",
        "signature",
        "credential",
        "apikey",
    ];
    const NAMES: &[&str] = &["sig", "key", "auth", "pwd", "pass"];
    value.match_indices("://").any(|(at, sep)| {
        let url = value[at + sep.len()..]
            .split(char::is_whitespace)
            .next()
            .unwrap_or("");
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let query = query.split('#').next().unwrap_or("");
        query.split('&').any(|pair| {
            let (key, val) = pair.split_once('=').unwrap_or((pair, ""));
            let key: String = key
                .chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .collect::<String>()
                .to_ascii_lowercase();
            !val.is_empty()
                && (PARTS.iter().any(|p| key.contains(p)) || NAMES.contains(&key.as_str()))
        })
    })
}

/// Whether variable `name`'s value holds credentials: a URL with them (in its authority or
/// its query string), or a proxy written without a scheme (`HTTPS_PROXY=user:pass@proxy:3128`,
/// which curl and pip take).
pub(crate) fn secret_in_value(name: &str, value: &str) -> bool {
    holds_url_credentials(value)
        || holds_query_secret(value)
        || (name.to_ascii_uppercase().ends_with("_PROXY") && value.contains('@'))
}

/// In local mode a child would inherit the environment of `floe run`, the user's shell's (a
/// pod's containers have only what their templates name): its credential-like variables, and
/// those whose value holds a URL with credentials, are removed, the harness's and the
/// evaluator's alike, since the evaluator runs the agent's code (tests import it). What the
/// job names in the child's `env` is set after this.
pub(crate) fn drop_users_credentials(spec: &mut CommandSpec) {
    spec.env_remove
        .extend(users_credentials(std::env::vars_os()));
}

/// The names of `vars` that hold credentials. A name or value that is not UTF-8 is read as far
/// as it is (a credential in it is ASCII all the same): skipped, such a variable was inherited
/// unread.
fn users_credentials(vars: impl Iterator<Item = (OsString, OsString)>) -> Vec<OsString> {
    vars.filter(|(k, v)| {
        let name = k.to_string_lossy();
        credential_like(&name) || secret_in_value(&name, &v.to_string_lossy())
    })
    .map(|(k, _)| k)
    .collect()
}

#[derive(Clone, Debug)]
pub struct RunnerConfig {
    pub gateway_url: String,
    pub control_token: String,
    /// The task workspace (the harness's working directory).
    pub workspace: PathBuf,
    /// Runner-private state: pristine snapshot, harness home, logs, evaluation copy. Must be
    /// outside the workspace.
    pub state_dir: PathBuf,
    /// The pool's prepare steps, run before the sandbox reports ready.
    pub pool_prepare: Vec<PrepareStep>,
    /// Give up waiting for an assignment after this long (`None`: wait forever, as a warm
    /// pod does).
    pub assignment_wait: Option<Duration>,
    /// Take only this session's assignment (a local run's runner is started for one session).
    pub session: Option<String>,
    /// How long to wait for the gateway to ship the trajectory before exiting.
    pub ship_wait: Duration,
    /// Bytes of stdout/stderr kept per process.
    pub log_cap_bytes: u64,
    /// SIGTERM → SIGKILL grace for timed-out process groups.
    pub kill_grace: Duration,
    /// Run the harness and the evaluator each in their own sandbox (local mode); `None` in a
    /// pod, whose containers are the sandbox.
    pub confinement: Option<Confinement>,
    /// Pods: the harness runs in the agent container, not here ([`agent_link`]).
    pub agent: Option<AgentContainer>,
    /// Pods: check at start that egress is restricted ([`crate::egress_check`]).
    pub egress_check: Option<crate::egress_check::EgressCheck>,
    /// Bytes the harness's workspace and home may hold together while it runs
    /// ([`crate::disk_budget`]); `None`: no budget.
    pub disk_budget: Option<u64>,
    /// What grades `reward.source: SWEBench` ([`crate::swebench_grade`]).
    pub swebench: Option<crate::swebench_grade::Bridge>,
    /// Where the evaluation copy is built (default `state_dir/eval`). A pod grading SWE-bench
    /// instances mounts it where the image keeps the repository (`/testbed`): the image's
    /// environment (an editable install) imports from there.
    pub eval_dir: Option<PathBuf>,
    /// The workspace already holds a copy of this image directory (a pod's seed step copied it
    /// before the runner started): a task whose `repository.path` it is checks out in place.
    pub seeded_from: Option<PathBuf>,
}

impl RunnerConfig {
    /// Where the evaluation copy is built.
    pub fn eval_dir(&self) -> PathBuf {
        self.eval_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("eval"))
    }
}

/// Where the agent container is and what it shares with this one.
#[derive(Clone, Debug)]
pub struct AgentContainer {
    /// The loopback address its supervisor dials.
    pub listen: std::net::SocketAddr,
    /// A volume both containers mount: the harness's home, instruction and logs. The agent
    /// can write it, so nothing the grader relies on lives there.
    pub dir: PathBuf,
    /// How long the supervisor may take to dial (the container starting).
    pub dial_wait: Duration,
    /// Where the agent container mounts the workspace, when not where this one does.
    pub workspace: Option<PathBuf>,
    /// The agent container's `(uid, gid)` when this runner is root (a SWE-bench pod's grader,
    /// which the images' root-owned environments need): the workspace and the agent's
    /// directory are made the agent's before it starts, and the evaluator (the eval script,
    /// the agent's code in it) runs with no capability
    /// ([`crate::process::CommandSpec::drop_capabilities`]).
    pub user: Option<(u32, u32)>,
}

/// A child process of the runner: `<name>.stdout/.stderr` in the state's `logs/`, the runner's
/// private variables removed, its output cap and kill grace.
pub(crate) fn child(
    config: &RunnerConfig,
    name: &str,
    program: &str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: &Path,
    timeout_seconds: i32,
) -> CommandSpec {
    let logs = config.state_dir.join("logs");
    CommandSpec {
        program: program.to_string(),
        args,
        env,
        env_remove: PRIVATE_ENV.iter().map(OsString::from).collect(),
        cwd: cwd.to_path_buf(),
        stdout: logs.join(format!("{name}.stdout")),
        stderr: logs.join(format!("{name}.stderr")),
        cap_bytes: config.log_cap_bytes,
        timeout: Duration::from_secs(timeout_seconds.max(1) as u64),
        kill_grace: config.kill_grace,
        drop_capabilities: false,
        refuse_adoption: false,
    }
}

/// Whether `spec`'s program exists and is executable, looked up as the sandbox will.
pub(crate) fn startable(spec: &CommandSpec) -> Result<(), String> {
    startable_in(&spec.program, &spec.env, &spec.cwd)
        .then_some(())
        .ok_or_else(|| format!("{}: not found or not executable", spec.program))
}

/// Whether `program`, run in `cwd` with `env` (over `floe run`'s own), would be found.
pub(crate) fn startable_in(program: &str, env: &[(String, String)], cwd: &Path) -> bool {
    confine::resolve_program(program, cwd, path_in(env).as_deref()).is_some()
}

/// The `PATH` a command run with `env` (over `floe run`'s own) looks programs up on.
pub(crate) fn path_in(env: &[(String, String)]) -> Option<String> {
    env.iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PATH").ok())
}

/// The last `max` bytes of a log, read from its end (a log may be a 64 GiB sparse file).
pub(crate) fn tail(path: &Path, max: usize) -> String {
    std::fs::File::open(path)
        .map(|f| tail_of(f, max))
        .unwrap_or_default()
}

pub(crate) fn tail_of(mut file: std::fs::File, max: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::new();
    let read = file.metadata().and_then(|m| {
        file.seek(SeekFrom::Start(m.len().saturating_sub(max as u64)))?;
        file.take(max as u64).read_to_end(&mut bytes)
    });
    if read.is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&bytes).trim().to_string()
}

#[cfg(test)]
mod credential_tests {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    use super::{credential_like, holds_url_credentials, secret_in_value, users_credentials};

    #[test]
    fn variables_that_are_not_utf8_are_read_too() {
        let os = |b: &[u8]| OsString::from_vec(b.to_vec());
        let vars = [
            (os(b"PIP_INDEX_URL"), os(b"https://u:p@mirror/simple \xff")),
            (os(b"MY_\xffTOKEN"), os(b"t")),
            (os(b"LANG\xff"), os(b"C")),
            (os(b"NOTE"), os(b"caf\xe9")),
        ];
        assert_eq!(
            users_credentials(vars.into_iter()),
            [os(b"PIP_INDEX_URL"), os(b"MY_\xffTOKEN")]
        );
    }

    #[test]
    fn urls_with_credentials_in_values_are_told_from_plain_ones() {
        for value in [
            "https://user:THE-PASSWORD@pypi.internal/simple",
            "https://ghp_TOKEN@github.com/org/repo.git",
            "https://pypi.org/simple https://u:p@mirror.internal",
            "https://u:p@host",
        ] {
            assert!(holds_url_credentials(value), "{value}");
        }
        for value in [
            "https://pypi.org/simple",
            "http://127.0.0.1:8000/v1",
            "https://host/path@v1",
            "https://host/?user=a@b",
            "git@github.com:org/repo.git",
            "https://@host/",
            "a@b",
        ] {
            assert!(!holds_url_credentials(value), "{value}");
        }
        for value in [
            "https://bucket.s3.amazonaws.com/w.bin?X-Amz-Credential=AK%2F1&X-Amz-Signature=ab12",
            "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=Zm9v",
            "https://storage.googleapis.com/b/o?X-Goog-Signature=00ff",
            "wss://feed.internal/stream?access_token=eyJ",
            "https://api.internal/v1?api_key=k1#top",
            "https://hooks.internal/x?key=abc",
        ] {
            assert!(secret_in_value("DATA_URL", value), "{value}");
        }
        for value in [
            "https://pypi.org/simple?format=json",
            "https://host/search?q=token",
            "https://host/?token=",
            "https://host/path/token=abc",
            "no url ?token=abc",
        ] {
            assert!(!secret_in_value("DATA_URL", value), "{value}");
        }
        assert!(secret_in_value("https_proxy", "user:pass@proxy:3128"));
        assert!(!secret_in_value("HTTPS_PROXY", "proxy:3128"));
        assert!(!secret_in_value("MAINTAINER", "a@b"));
    }

    #[test]
    fn credentials_are_told_from_the_rest_of_the_environment() {
        for name in [
            "HF_TOKEN",
            "GITHUB_TOKEN",
            "gh_token",
            "OPENAI_API_KEY",
            "AWS_PROFILE",
            "AWS_SECRET_ACCESS_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "PGPASSWORD",
            "KUBECONFIG",
            "SSH_AUTH_SOCK",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            assert!(credential_like(name), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "LANG",
            "NODE_OPTIONS",
            "TERM",
            "TOKENIZERS_PARALLELISM",
        ] {
            assert!(!credential_like(name), "{name}");
        }
    }
}
