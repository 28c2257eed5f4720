//! A namespace per test, deleted when the test ends.

use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Result;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::Client;

use crate::cluster::TestCluster;

pub struct TestNamespace {
    pub name: String,
    kubeconfig: std::path::PathBuf,
    kubectl: std::path::PathBuf,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestNamespace {
    /// Create `floe-test-<label>-<pid>-<n>`.
    pub async fn create(cluster: &TestCluster, client: &Client, label: &str) -> Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("floe-test-{label}-{}-{n}", std::process::id());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"floe.dev/test": "true"}}
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Self {
            name,
            kubeconfig: cluster.kubeconfig.clone(),
            kubectl: cluster.kubectl.clone(),
        })
    }
}

impl Drop for TestNamespace {
    /// A failed test still cleans up (best effort, without waiting).
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.kubectl)
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .env("KUBECONFIG", &self.kubeconfig)
            .output();
    }
}

/// The usual start of a control-plane test: a client, floe's CRDs installed, and a fresh
/// namespace `floe-test-<label>-…`.
pub async fn with_crds(label: &str) -> anyhow::Result<(Client, TestNamespace)> {
    let c = crate::cluster::cluster();
    let client = c.client().await?;
    c.install_crds(&client).await?;
    let ns = TestNamespace::create(c, &client, label).await?;
    Ok((client, ns))
}
