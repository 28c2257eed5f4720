//! Real `floe` processes for end-to-end tests: the gateway sidecar and the sandbox runner, as
//! they run in a pod (here on loopback, with the test playing the operator's part).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cluster::{floe_bin, workspace_root};

pub const CONTROL_TOKEN: &str = "e2e-control-token";

/// Install (once, cached) a harness CLI from npm with the project's script; returns its bin
/// directory, to put on the runner's PATH.
pub fn harness_bin_dir(harness: &str) -> Result<PathBuf> {
    let out = Command::new(workspace_root().join("scripts/harnesses/install.sh"))
        .arg(harness)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "installing {harness}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    Ok(bin
        .parent()
        .context("harness bin has a directory")?
        .to_path_buf())
}

/// A child process, killed (and reaped) when dropped.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `floe policy-proxy` in front of `upstream`, demanding `token` for inference; killed when
/// dropped.
pub struct PolicyProxy {
    pub url: String,
    _child: KillOnDrop,
}

impl PolicyProxy {
    /// On `listen` (port 0: a free one), once it answers `/health`.
    pub async fn start(listen: std::net::SocketAddr, upstream: &str, token: &str) -> Result<Self> {
        let listen = match listen.port() {
            0 => std::net::TcpListener::bind(listen)?.local_addr()?,
            _ => listen,
        };
        let child = Command::new(floe_bin()?)
            .args(["policy-proxy", "--listen", &listen.to_string()])
            .args(["--upstream", upstream])
            .env("FLOE_POLICY_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let proxy = PolicyProxy {
            url: format!("http://{listen}"),
            _child: KillOnDrop(child),
        };
        let http = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(r) = http.get(format!("{}/health", proxy.url)).send().await {
                if r.status().is_success() {
                    return Ok(proxy);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("floe policy-proxy did not come up on {listen}")
    }
}

/// The command of a sandbox pod's gateway sidecar on a loopback address of its own (`ip`, as
/// the pod's IP): model API on 8370, control API on `control_port`, captures and the control
/// token (a file `token`, written by the caller) under `root`, no real upstream.
pub fn sidecar_gateway(bin: &Path, ip: &str, control_port: i32, root: &Path) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["gateway", "--listen", &format!("{ip}:8370")])
        .args(["--control-listen", &format!("{ip}:{control_port}")])
        .args(["--upstream", "http://127.0.0.1:9"])
        .arg("--capture-dir")
        .arg(root.join("captures"))
        .arg("--control-token-file")
        .arg(root.join("token"))
        .stdout(Stdio::null());
    command
}

/// A `floe gateway` child process. Killed when dropped.
pub struct GatewayProcess {
    pub url: String,
    pub root: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    http: reqwest::Client,
}

impl GatewayProcess {
    /// Start a gateway with its captures, spool and control token under `root`.
    pub async fn start(root: &Path, upstream: &str, extra: &[&str]) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        std::fs::write(root.join("control-token"), CONTROL_TOKEN)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut args: Vec<String> = [
            "gateway",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            upstream,
            "--capture-dir",
            root.join("captures").to_str().context("utf-8 path")?,
            "--control-token-file",
            root.join("control-token").to_str().context("utf-8 path")?,
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut gateway = Self {
            url: format!("http://127.0.0.1:{port}"),
            root: root.to_path_buf(),
            args,
            child: None,
            http: reqwest::Client::new(),
        };
        gateway.spawn().await?;
        Ok(gateway)
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("gateway.log"))?;
        self.child = Some(
            Command::new(floe_bin()?)
                .args(&self.args)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        );
        for _ in 0..200 {
            if self
                .http
                .get(format!("{}/healthz", self.url))
                .send()
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("floe gateway did not come up; log: {}", self.log())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("gateway.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: a crash, nothing gets to clean up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM (what the kubelet sends) and wait for the exit. Blocks: use a multi-threaded
    /// test runtime when servers in the test process must keep answering meanwhile.
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("gateway not running")?;
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        Ok(child.wait()?)
    }

    /// Start again with the same flags and directories (after `kill` or `terminate`).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn().await
    }

    pub async fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(CONTROL_TOKEN);
        if let Some(body) = body {
            request = request.json(body);
        }
        let resp = request.send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// What the operator does: post the assignment to the gateway's control API.
    pub async fn assign(&self, assignment: &Value) -> Result<()> {
        self.assign_at(&self.url, assignment).await
    }

    /// Post the assignment to `base` (e.g. the gateway's `--control-listen` address).
    pub async fn assign_at(&self, base: &str, assignment: &Value) -> Result<()> {
        let resp = self
            .http
            .post(format!("{base}/floe/v1/assignments"))
            .bearer_auth(CONTROL_TOKEN)
            .json(assignment)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let body = resp.text().await?;
        anyhow::ensure!(
            status == 201 || status == 200,
            "assignment: {status} {body}"
        );
        Ok(())
    }

    pub async fn ready(&self) -> bool {
        self.http
            .get(format!("{}/readyz", self.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Start `floe sandbox` against `gateway` with `path_dirs` prepended to PATH.
pub fn spawn_sandbox(
    gateway: &GatewayProcess,
    root: &Path,
    path_dirs: &[PathBuf],
) -> Result<Child> {
    let mut path =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect::<Vec<_>>();
    for dir in path_dirs.iter().rev() {
        path.insert(0, dir.clone());
    }
    let log = std::fs::File::create(root.join("sandbox.log"))?;
    // In its own session (setsid), like a container: `kill_session` ends the runner and
    // everything it started, as a container's death would.
    Ok(Command::new("setsid")
        .arg(floe_bin()?)
        .args(["sandbox", "--gateway", &gateway.url])
        .arg("--control-token-file")
        .arg(gateway.root.join("control-token"))
        .arg("--workspace")
        .arg(root.join("workspace"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .arg("--summary-file")
        .arg(root.join("summary.json"))
        .args([
            "--assignment-timeout-seconds",
            "120",
            "--ship-timeout-seconds",
            "30",
        ])
        .env("PATH", std::env::join_paths(path)?)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?)
}

/// SIGKILL every process in the session `leader` started (a container dying).
pub fn kill_session(leader: &mut Child) -> Result<()> {
    Command::new("pkill")
        .args(["-KILL", "-s", &leader.id().to_string()])
        .status()?;
    let _ = leader.wait();
    Ok(())
}

/// Wait for a child with a deadline; kill it on expiry.
pub async fn wait_child(child: &mut Child, limit: Duration) -> Result<std::process::ExitStatus> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            bail!("still running after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
