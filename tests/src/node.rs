//! The genuine one-node cluster (`scripts/kube-test-cluster/start.sh --node`): its own control
//! plane, a real kubelet with containerd and runc, kube-scheduler and kube-proxy. Apart from
//! [`crate::cluster()`]: a real kubelet would run the pods the played-kubelet tests create.
//!
//! [`node()`] is the one `scripts/test.sh` started (`FLOE_TEST_NODE_DIR`), or else one this
//! fixture starts or reuses in `target/knode` (stop it with `scripts/kube-test-cluster/stop.sh
//! target/knode`). Root only. It never skips: without a node, the test fails and says why.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

use crate::cluster::{floe_bin, workspace_root, TestCluster};

pub struct TestNode {
    pub cluster: TestCluster,
    pub dir: PathBuf,
    /// The host's address on the pods' bridge: what pods reach the host by.
    pub host_ip: Ipv4Addr,
    /// Host TCP ports pods may reach on `host_ip` (every other one is closed to them).
    pub host_ports: Vec<u16>,
}

/// Images in the node's containerd, built from this machine's files.
pub struct NodeImages {
    /// `floe` (operator, gateway sidecar, floe-init, collector).
    pub floe: String,
    /// Debian's python3.11 and busybox, USER 1000.
    pub python: String,
    /// The python sandbox plus Node.js and the five harness CLIs (`pi`, `codex`, `claude`,
    /// `qwen`, `gemini` on PATH).
    pub harnesses: String,
    /// The trainer pod's image (`vllm`, `torchrun`, `floe-trainer` on PATH), when the tests
    /// have the vLLM venv (`FLOE_TEST_PYTHON`): it runs that venv from the pod's model volume,
    /// a hostPath of [`NodeImages::trainer_volume`] at `/models`.
    pub trainer: Option<String>,
    /// The host directory holding the venv and the converted models.
    pub trainer_volume: Option<PathBuf>,
}

static NODE: OnceLock<TestNode> = OnceLock::new();
static IMAGES: OnceLock<NodeImages> = OnceLock::new();

pub fn node() -> &'static TestNode {
    NODE.get_or_init(|| match start_or_reuse() {
        Ok(n) => n,
        Err(e) => panic!("no real node for the test: {e:#}"),
    })
}

fn script(name: &str) -> PathBuf {
    workspace_root()
        .join("scripts/kube-test-cluster")
        .join(name)
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed with {}", out.status);
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn start_or_reuse() -> Result<TestNode> {
    let dir = match std::env::var_os("FLOE_TEST_NODE_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let dir = workspace_root().join("target/knode");
            // Reused when alive (its ports then stay what they were).
            let ports = format!("{} {}", free_port()?, free_port()?);
            run(Command::new(script("start.sh"))
                .arg("--node")
                .arg(&dir)
                .env("FLOE_NODE_HOST_PORTS", ports))?;
            dir
        }
    };
    let read = |name: &str| -> Result<String> {
        Ok(std::fs::read_to_string(dir.join(name))
            .with_context(|| format!("{} (is the node started?)", dir.join(name).display()))?
            .trim()
            .to_string())
    };
    let host_ip = read("host-ip")?.parse()?;
    let host_ports = read("host-ports")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<Vec<u16>, _>>()?;
    let kubeconfig = dir.join("kubeconfig");
    if !kubeconfig.is_file() {
        bail!("{} does not exist", kubeconfig.display());
    }
    Ok(TestNode {
        cluster: TestCluster {
            kubeconfig,
            kubectl: dir.join("kubectl"),
        },
        dir,
        host_ip,
        host_ports,
    })
}

impl TestNode {
    /// The images, built and imported once per test process (`images.sh`).
    pub fn images(&self) -> Result<&'static NodeImages> {
        if let Some(i) = IMAGES.get() {
            return Ok(i);
        }
        // One build at a time: tests start in parallel, and two `images.sh` on a cold cache
        // race for apt's lock (a cold CI run lost a test that way).
        static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = IMAGES.get() {
            return Ok(i);
        }
        let mut build = Command::new(script("images.sh"));
        build.arg(&self.dir).arg(floe_bin()?);
        if let Some(python) = std::env::var_os("FLOE_TEST_PYTHON") {
            build.env("FLOE_TRAINER_PYTHON", python);
        }
        let out = run(&mut build)?;
        let get = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_string)
                .with_context(|| format!("images.sh printed no {key}= line: {out}"))
        };
        let images = NodeImages {
            floe: get("floe")?,
            python: get("python")?,
            harnesses: get("harnesses")?,
            trainer: get("trainer").ok(),
            trainer_volume: get("trainer-volume").ok().map(PathBuf::from),
        };
        Ok(IMAGES.get_or_init(|| images))
    }

    /// Stop the kubelet (SIGTERM, as a service manager restarting it does) and start it again
    /// with the same flags (`start.sh --node`, which starts only what is not running), returning
    /// once the node is Ready with a heartbeat from the new kubelet. Running containers stay
    /// with containerd meanwhile.
    pub fn restart_kubelet(&self) -> Result<std::time::Duration> {
        let started = std::time::Instant::now();
        let pid_file = self.dir.join("kubelet.pid");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .with_context(|| pid_file.display().to_string())?
            .trim()
            .parse()?;
        run(Command::new("kill").arg(pid.to_string()))?;
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            // Gone, or a zombie its (re)parent has not reaped yet.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z'))
            })
        });
        if !gone {
            bail!("the kubelet (pid {pid}) did not stop within 20 s of SIGTERM");
        }
        let ports = self
            .host_ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        run(Command::new(script("start.sh"))
            .arg("--node")
            .arg(&self.dir)
            .env("FLOE_NODE_HOST_PORTS", ports))?;
        Ok(started.elapsed())
    }

    /// Create `object` in `ns`: floe's resources through kube-rs, anything else with
    /// `kubectl apply`.
    pub async fn apply(
        &self,
        client: &kube::Client,
        ns: &str,
        object: serde_json::Value,
    ) -> Result<()> {
        use floe_crds::{GatewayPool, RolloutJob};
        use kube::api::{Api, PostParams};
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "GatewayPool" => {
                Api::<GatewayPool>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), &serde_json::from_value(object)?)
                    .await?;
            }
            "RolloutJob" => {
                Api::<RolloutJob>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), &serde_json::from_value(object)?)
                    .await?;
            }
            _ => {
                let yaml = serde_yaml::to_string(&object)?;
                let out = self
                    .cluster
                    .kubectl(&["apply", "-n", ns, "-f", "-"], Some(yaml.as_bytes()))?;
                if !out.status.success() {
                    bail!(
                        "kubectl apply {kind}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
        }
        Ok(())
    }

    /// The model server as pods see it: the Service `teacher:8000` in `ns`, whose endpoint is
    /// the host's bridge address, where [`host_services`] relays to the real vLLM on loopback.
    pub async fn model_service(&self, client: &kube::Client, ns: &str) -> Result<()> {
        self.host_service(client, ns, "teacher", self.model_port()?)
            .await
    }

    /// The Service `name:8000` in `ns`, without selector: its endpoint is the host's bridge
    /// address on `port` (one of the ports open to pods).
    pub async fn host_service(
        &self,
        client: &kube::Client,
        ns: &str,
        name: &str,
        port: u16,
    ) -> Result<()> {
        use serde_json::json;
        self.apply(
            client,
            ns,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                   "spec": {"ports": [{"port": 8000, "targetPort": port}]}}),
        )
        .await?;
        self.apply(
            client,
            ns,
            json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name},
                   "subsets": [{"addresses": [{"ip": self.host_ip.to_string()}],
                                "ports": [{"port": port}]}]}),
        )
        .await
    }

    /// The second host port open to pods, for a test's own server on the bridge address: one
    /// test at a time, until the guard drops.
    pub async fn spare_port(&self) -> Result<(u16, tokio::sync::MutexGuard<'static, ()>)> {
        static SPARE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let held = SPARE.lock().await;
        let port = self.host_ports.get(1).copied().with_context(|| {
            format!(
                "the node opened no second host port to pods ({})",
                self.dir.display()
            )
        })?;
        Ok((port, held))
    }

    /// A hostPath volume at `dir` for a job's dataset, owned by the collector's user
    /// (hostPath ignores `fsGroup`), bound to the claim `data` in `ns`.
    pub async fn dataset_volume(&self, client: &kube::Client, ns: &str, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let chown = Command::new("chown").arg("65532:65532").arg(dir).status()?;
        if !chown.success() {
            bail!("chown 65532:65532 {}", dir.display());
        }
        self.host_path_claim(client, ns, "data", dir, "ReadWriteOnce", "Delete")
            .await
    }

    /// The claim `claim` in `ns`, bound to a PersistentVolume `{ns}-{claim}` of the host
    /// directory `dir` (which must exist) with the given access mode and reclaim policy.
    pub async fn host_path_claim(
        &self,
        client: &kube::Client,
        ns: &str,
        claim: &str,
        dir: &Path,
        access: &str,
        reclaim: &str,
    ) -> Result<()> {
        use serde_json::json;
        let pv = format!("{ns}-{claim}");
        self.apply(
            client,
            ns,
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                   "spec": {"capacity": {"storage": "1Gi"}, "accessModes": [access],
                            "persistentVolumeReclaimPolicy": reclaim, "storageClassName": "",
                            "hostPath": {"path": dir.display().to_string(), "type": "Directory"},
                            "claimRef": {"namespace": ns, "name": claim}}}),
        )
        .await?;
        self.apply(
            client,
            ns,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
                   "spec": {"accessModes": [access], "storageClassName": "", "volumeName": pv,
                            "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await
    }

    /// The host port where [`host_services`] relays to vLLM: the first one open to pods.
    pub fn model_port(&self) -> Result<u16> {
        self.host_ports.first().copied().with_context(|| {
            format!(
                "the node opened no host port to pods ({})",
                self.dir.display()
            )
        })
    }

    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }
}

/// What the node's pods use from the host, served for the whole test process from a thread of
/// its own (a test's runtime ends with the test; these must outlive every test using the node):
/// the cluster DNS on the bridge address, port 53, and a relay from the bridge address's first
/// open port to the real vLLM (see [`TestNode::model_port`]).
pub fn host_services(n: &TestNode) -> Result<()> {
    started_once(n, true)
}

/// [`host_services`] without the relay to vLLM (and without starting one): for a process whose
/// pods' model is a server of its own. Whichever of the two a process calls first is what it
/// gets.
pub fn host_dns(n: &TestNode) -> Result<()> {
    started_once(n, false)
}

fn started_once(n: &TestNode, relay_model: bool) -> Result<()> {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    STARTED
        .get_or_init(|| start_host_services(n, relay_model).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn start_host_services(n: &TestNode, relay_model: bool) -> Result<()> {
    let vllm: Option<SocketAddr> = if relay_model {
        let url = &crate::vllm::vllm().url;
        Some(
            url.trim_start_matches("http://")
                .parse()
                .context("vLLM URL")?,
        )
    } else {
        None
    };
    let dns_addr = SocketAddr::new(n.host_ip.into(), 53);
    let model_addr = SocketAddr::new(n.host_ip.into(), n.model_port()?);
    let cluster = n.cluster.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Err(anyhow::Error::from(e)));
                return;
            }
        };
        runtime.block_on(async move {
            let started = async {
                let client = cluster.client().await?;
                let dns = crate::cluster_dns::ClusterDns::start(client, dns_addr).await?;
                let forward = match vllm {
                    Some(vllm) => Some(Forward::start(model_addr, vllm).await?),
                    None => None,
                };
                anyhow::Ok((dns, forward))
            }
            .await;
            match started {
                Ok(serving) => {
                    let _ = tx.send(Ok(()));
                    let _serving = serving;
                    std::future::pending::<()>().await;
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
    });
    rx.recv().context("the host services' thread ended")?
}

/// A TCP relay from `listen` to `target` (a loopback server pods cannot reach themselves),
/// until dropped.
pub struct Forward {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Forward {
    pub async fn start(listen: SocketAddr, target: SocketAddr) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Self { task })
    }
}

/// The last lines of a file (a component's log, for a failure message).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
