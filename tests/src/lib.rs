//! Fixtures for the integration tests in `tests/tests/`.
//!
//! [`cluster()`] gives the genuine control plane the tests run against: the one named by
//! `FLOE_TEST_KUBECONFIG` (what `scripts/test.sh` starts), or else one this fixture starts or
//! reuses in `target/kapi-test` with `scripts/kube-test-cluster/start.sh`. It never skips: when
//! no control plane can be had, the test fails and says why.

pub mod chart;
pub mod cluster;
pub mod cluster_dns;
pub mod fault_proxy;
pub mod gateway;
pub mod grading_attacks;
pub mod ingest;
pub mod kubelet;
pub mod memory;
pub mod namespace;
pub mod node;
pub mod operator;
pub mod proc_cpu;
pub mod processes;
pub mod prometheus;
pub mod scripted_upstream;
pub mod sglang_shim;
pub mod swebench_instance;
pub mod toy_task;
pub mod trainer_ingest;
pub mod vllm;

pub use cluster::{cluster, floe_bin, workspace_root, TestCluster};
pub use fault_proxy::{Fault, FaultProxy};
pub use gateway::TestGateway;
pub use ingest::TestIngest;
pub use memory::{memory_lease, MemoryLease, Share};
pub use namespace::TestNamespace;
pub use processes::{harness_bin_dir, kill_session, spawn_sandbox, wait_child, GatewayProcess};
pub use scripted_upstream::{ScriptedUpstream, Step};
pub use sglang_shim::{SglangShim, SHIM_WEIGHT_VERSION};
pub use trainer_ingest::TrainerIngest;
pub use vllm::setup as vllm_setup;
pub use vllm::{tokenize, tokenize_at, vllm, vllm_long, vllm_vision, Vllm};

/// A scratch directory for a fixture's state (logs, pods' files): removed when the returned
/// guard drops, unless `FLOE_TEST_KEEP` is set (then kept, and its path printed as `what`'s).
pub fn scratch_dir(what: &str) -> std::io::Result<(std::path::PathBuf, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir()?;
    if std::env::var_os("FLOE_TEST_KEEP").is_some() {
        let kept = dir.keep();
        eprintln!("{what}: keeping {}", kept.display());
        Ok((kept, None))
    } else {
        Ok((dir.path().to_path_buf(), Some(dir)))
    }
}

/// The `q` quantile (0–1) of `v`, nearest rank; `v` must not be empty.
pub fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}
