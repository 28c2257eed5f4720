//! `floe crds`: the CRDs rendered for the cluster they are about to be applied to.
//!
//! `floe crds | kubectl apply -f -` is the command users type. An apiserver older than 1.25
//! (and its kubectl) rejects `x-kubernetes-validations`, so without `--kube-version` the
//! command asks the cluster kubectl would talk to (`KUBECONFIG`, `~/.kube/config`, or the
//! pod's service account) for its version, the way `helm template --validate` does. When no
//! cluster answers, the CRDs are rendered for a current one and stderr says so: a pipe into
//! `kubectl apply` would fail to reach it anyway, and a file written for later (GitOps) names
//! its version with `--kube-version`.

use std::time::Duration;

use floe_crds::generate::{Target, VersionError};

/// How long the version lookup may take before the command falls back.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum CrdsError {
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error(transparent)]
    Generate(#[from] floe_crds::generate::GenerateError),
    #[error("cannot write the CRDs: {0}")]
    Write(#[from] std::io::Error),
}

/// Where the target came from, said on stderr so a user sees what was rendered and why.
enum Chosen {
    Flag,
    Cluster(String),
    Fallback(String),
}

pub fn run(kube_version: Option<String>) -> Result<(), CrdsError> {
    use std::io::Write;
    let (target, chosen) = match kube_version {
        Some(v) => (Target::for_kube_version(&v)?, Chosen::Flag),
        None => match cluster_version() {
            Ok(v) => (Target::for_kube_version(&v)?, Chosen::Cluster(v)),
            Err(why) => (Target::LATEST, Chosen::Fallback(why)),
        },
    };
    let yaml = floe_crds::generate::crds_yaml(target)?;
    std::io::stdout().lock().write_all(yaml.as_bytes())?;
    let rules = if target.cel {
        "with CEL validation rules"
    } else {
        "without CEL validation rules (the operator enforces them)"
    };
    match chosen {
        Chosen::Flag => {}
        Chosen::Cluster(v) => eprintln!("floe crds: rendered for the cluster's Kubernetes {v}, {rules}"),
        Chosen::Fallback(why) => eprintln!(
            "floe crds: no cluster answered ({why}); rendered for Kubernetes {}+, {rules}. For an older cluster pass --kube-version (e.g. --kube-version 1.20)",
            format_args!("1.{}", floe_crds::generate::CEL_MIN_MINOR),
        ),
    }
    Ok(())
}

/// `major.minor` of the cluster kubectl's configuration points at.
fn cluster_version() -> Result<String, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("no async runtime: {e}"))?;
    runtime.block_on(async {
        let ask = async {
            let config = kube::Config::infer().await.map_err(|e| e.to_string())?;
            let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
            let info = client
                .apiserver_version()
                .await
                .map_err(|e| e.to_string())?;
            // Some distributions say "20+" for the minor version.
            Ok(format!(
                "{}.{}",
                info.major,
                info.minor.trim_end_matches('+')
            ))
        };
        tokio::time::timeout(ASK_TIMEOUT, ask)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", ASK_TIMEOUT.as_secs())))
    })
}
