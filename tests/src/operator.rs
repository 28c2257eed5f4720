//! The real `floe operator` process against the test control plane, and polling helpers.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Result;

use crate::cluster::{cluster, floe_bin, TestCluster};

/// A running `floe operator`; killed (SIGKILL) when dropped.
pub struct Operator {
    pub child: Child,
    pub metrics_port: u16,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Operator {
    /// Watch one namespace; `extra` flags are appended.
    pub fn start(namespace: &str, extra: &[&str]) -> Result<Self> {
        Self::start_with_env(namespace, extra, &[])
    }

    /// As [`Operator::start`], with extra environment variables (fault injection).
    pub fn start_with_env(namespace: &str, extra: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        Self::start_on(cluster(), "floe:test", namespace, extra, env)
    }

    /// On another cluster (the real node's), with its pods made from `floe_image`.
    pub fn start_on(
        on: &TestCluster,
        floe_image: &str,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::env::temp_dir().join(format!("floe-operator-{namespace}-{port}.log"));
        let child = Command::new(floe_bin()?)
            .arg("operator")
            .arg("--kubeconfig")
            .arg(&on.kubeconfig)
            .args([
                "--namespace",
                namespace,
                "--floe-image",
                floe_image,
                "--sidecars",
                "auto",
            ])
            .args(extra)
            .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(Self {
            child,
            metrics_port: port,
        })
    }

    pub async fn metrics(&self) -> Result<String> {
        Ok(
            reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
                .await?
                .text()
                .await?,
        )
    }

    /// SIGKILL: an operator crash mid-reconcile.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one series (`name{labels}`, exactly as exposed) on a Prometheus metrics page.
pub fn metric_value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Poll `check` every 250 ms until it yields a value, for at most `seconds`.
pub async fn eventually_within<T>(
    seconds: u64,
    what: &str,
    check: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    eventually_every(Duration::from_millis(250), seconds, what, check).await
}

/// Poll `check` every `every` until it yields a value, for at most `seconds`.
pub async fn eventually_every<T>(
    every: Duration,
    seconds: u64,
    what: &str,
    mut check: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out after {seconds} s waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

/// Wait, at most `seconds`, until GatewayPool `name` reports `replicas` pods READY.
pub async fn pool_ready(
    pools: &kube::Api<floe_crds::GatewayPool>,
    name: &str,
    replicas: i32,
    seconds: u64,
) -> Result<()> {
    let what = format!("the pool {name} READY at {replicas}");
    eventually_within(seconds, &what, async || {
        let p = pools.get(name).await?;
        Ok((p.status.map(|s| s.ready_replicas) == Some(replicas)).then_some(()))
    })
    .await
}

/// [`eventually_within`] 60 s.
pub async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Result<Option<T>>) -> Result<T> {
    eventually_within(60, what, check).await
}
