//! `floe operator`: reconcile GatewayPools (and, next, RolloutJobs) on a cluster.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use floe_operator::client_rate::RateLimit;
use floe_operator::clients::operator_clients;
use floe_operator::leader::{Election, LeaseConfig};
use floe_operator::lease_fence::LeaseValidity;
use floe_operator::run::{run, OperatorConfig};

#[derive(Clone, Copy, ValueEnum)]
pub enum Sidecars {
    /// Native sidecars when the apiserver is 1.29 or newer.
    Auto,
    Native,
    Plain,
}

#[derive(Args)]
pub struct OperatorArgs {
    /// Kubeconfig file (default: $KUBECONFIG or ~/.kube/config when one loads, else the
    /// in-cluster config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long)]
    namespace: Option<String>,
    /// Image holding the `floe` binary, for the sandbox pods' init copy and gateway sidecar.
    #[arg(long, default_value = concat!("ghcr.io/floe-dev/floe:", env!("CARGO_PKG_VERSION")))]
    floe_image: String,
    /// How the gateway sidecar runs.
    #[arg(long, value_enum, default_value = "auto")]
    sidecars: Sidecars,
    /// Reconciles per controller at once.
    #[arg(long, default_value_t = 4)]
    concurrency: u16,
    /// Apiserver writes (claims, marks, releases) and assignment deliveries of one job's
    /// reconcile round in flight at once.
    #[arg(long, default_value_t = 16)]
    round_parallelism: usize,
    /// Claim pool pods for a job's sessions once its trainer or dataset collector pod runs,
    /// while it gets ready (a trainer loading its model), rather than once it is Ready. The
    /// sessions start when it is Ready either way; claiming early takes the claims' apiserver
    /// writes and the pool's refill out of the sessions' wait.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    claim_while_starting: bool,
    /// Pool pods claimed while the job's pod gets ready are given back (deleted unused; the
    /// pool warms fresh ones) when it has not been Ready for this many seconds, and no more are
    /// claimed until it is. A job's pod that fails (crash loop) gives them back at once.
    #[arg(long, default_value_t = floe_operator::run::DEFAULT_EARLY_CLAIM_LIMIT.as_secs(), value_name = "SECONDS")]
    claim_while_starting_limit: u64,
    /// Run the controllers only while holding a Lease, so several replicas can run.
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the Lease (default: `POD_NAMESPACE`, else `--namespace`, else `default`).
    #[arg(long)]
    lease_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(long, default_value = "floe-operator")]
    lease_name: String,
    /// Seconds without renewal after which a leader is considered gone.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_listen: std::net::SocketAddr,
    /// This replica's name in the Lease (default: `POD_NAME`, else host-pid).
    #[arg(long)]
    identity: Option<String>,
    /// Apiserver requests per second, sustained (client-side token bucket; 0 = no limit).
    #[arg(long, default_value_t = 100.0)]
    kube_qps: f64,
    /// Apiserver requests allowed at once above `--kube-qps` (the bucket's size).
    #[arg(long, default_value_t = 200)]
    kube_burst: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("kubeconfig {0}: {1}")]
    Kubeconfig(PathBuf, String),
    #[error("no kubeconfig and not in a cluster: {0}")]
    Infer(String),
    #[error("cannot reach the apiserver: {0}")]
    Client(#[from] kube::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

async fn clients(
    args: &OperatorArgs,
    validity: &LeaseValidity,
) -> Result<(kube::Client, kube::Client), OperatorError> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let bad =
                |e: &dyn std::fmt::Display| OperatorError::Kubeconfig(path.clone(), e.to_string());
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| bad(&e))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| OperatorError::Infer(e.to_string()))?,
    };
    let limit = RateLimit {
        qps: args.kube_qps,
        burst: args.kube_burst,
    };
    let connect_within = args.leader_elect.then(|| lease_duration(args) / 3);
    Ok(operator_clients(config, limit, validity, connect_within)?)
}

fn lease_duration(args: &OperatorArgs) -> std::time::Duration {
    std::time::Duration::from_secs(args.lease_duration_seconds.max(3))
}

pub fn main(args: OperatorArgs) -> Result<(), OperatorError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(OperatorError::Runtime)?;
    runtime.block_on(async {
        let validity = if args.leader_elect {
            LeaseValidity::elected()
        } else {
            LeaseValidity::unelected()
        };
        let (client, lease_client) = clients(&args, &validity).await?;
        let native_sidecars = match args.sidecars {
            Sidecars::Native => true,
            Sidecars::Plain => false,
            Sidecars::Auto => {
                let version = client.apiserver_version().await?;
                let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap_or(0);
                version.major == "1" && minor >= 29
            }
        };
        let leader = args.leader_elect.then(|| {
            let identity = args
                .identity
                .clone()
                .or_else(|| std::env::var("POD_NAME").ok())
                .unwrap_or_else(|| {
                    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
                    format!("{}-{}", host.trim(), std::process::id())
                });
            let duration = lease_duration(&args);
            let lease = LeaseConfig {
                namespace: args
                    .lease_namespace
                    .clone()
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .or_else(|| args.namespace.clone())
                    .unwrap_or_else(|| "default".into()),
                name: args.lease_name.clone(),
                identity,
                duration,
                renew_every: duration / 3,
            };
            Election {
                lease,
                client: lease_client,
                validity,
            }
        });
        run(
            client,
            OperatorConfig {
                namespace: args.namespace.clone(),
                floe_image: args.floe_image.clone(),
                native_sidecars,
                concurrency: args.concurrency,
                round_parallelism: args.round_parallelism,
                claim_while_starting: args.claim_while_starting.then_some(
                    std::time::Duration::from_secs(args.claim_while_starting_limit),
                ),
                leader,
                metrics_listen: Some(args.metrics_listen),
            },
        )
        .await;
        Ok(())
    })
}
