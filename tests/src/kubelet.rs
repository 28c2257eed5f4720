//! A stand-in for the kubelet, for operator tests on a control plane without nodes. It does
//! openly what a kubelet and the pod's containers would: for each sandbox pod it starts the
//! pod's real `floe gateway` sidecar (on a loopback address of its own, which becomes the
//! pod's IP, with the control token from the pod's Secret), reports the pod Running and Ready,
//! and — playing the runner — takes the assignment the operator delivered to that gateway and
//! ends the sandbox container with the exit code and termination message a `floe sandbox`
//! runner would leave. What each session "does" is decided by the test.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

use crate::cluster::floe_bin;
use crate::processes::KillOnDrop;

/// What the sandbox container of a session ends with.
#[derive(Clone, Debug)]
pub enum Verdict {
    /// Exit 0 (or 1 for an agent failure) with a reward in the summary.
    Scored { exit: i32, reward: f64 },
    /// Exit 0 with a reward, the session's calls sampled by policy versions `versions`
    /// (first, last), as a runner whose gateway read vLLM's version header reports them.
    Sampled { reward: f64, versions: [u64; 2] },
    /// Exit 3: infrastructure failure.
    Infra { error: String },
    /// Not finished yet: asked again on the next sync (forever, unless the answer changes).
    Hang,
    /// Evicted by the kubelet with this message (its words for a limit exceeded, or node
    /// pressure): phase Failed, reason Evicted, the containers killed with no summary.
    Evicted { message: String },
}

pub type Decide = Arc<dyn Fn(&Value) -> Verdict + Send + Sync>;

/// How the node behaves beyond the defaults.
#[derive(Default)]
pub struct NodeOptions {
    /// A job's own pod whose container runs `floe` and whose PersistentVolumeClaims are all
    /// here (claim name → local directory) really runs: its mount paths in the arguments point
    /// at those directories, `0.0.0.0` at the pod IP. Ready once its `/healthz` answers; a
    /// process that exits is reported like a crash loop, with its stderr as the termination
    /// message (`FallbackToLogsOnError`).
    pub volumes: HashMap<String, PathBuf>,
    /// How long a job's own pod that does not really run here (trainer, dataset collector)
    /// takes from its creation to Ready. A real one pulls an image and starts (a trainer loads
    /// a model: minutes); by default this node reports it Ready at once. When set, the pod is
    /// reported Running (containers started, not Ready) at once and Ready after this long.
    pub job_pod_start: Duration,
    /// Sandbox pods are reported Ready but their gateway stops once it was up: no delivery
    /// reaches it, as with an operator that cannot reach the pods' control port.
    pub dead_gateways: bool,
}

struct Running {
    _gateway: Option<KillOnDrop>,
    /// What the pod's runner took from its gateway: filled by its long poll.
    assignment: Arc<Mutex<Option<Value>>>,
    _runner: AbortOnDrop,
    done: bool,
}

pub struct FakeKubelet {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<()>>,
    taken: Arc<Mutex<Vec<Value>>>,
}

impl FakeKubelet {
    /// Pods of `namespace` get IPs `127.<block>.x.y`.
    pub fn start(client: Client, namespace: &str, block: u8, decide: Decide) -> Result<Self> {
        Self::start_with(client, namespace, block, decide, NodeOptions::default())
    }

    /// Like [`FakeKubelet::start`], with [`NodeOptions`].
    pub fn start_with(
        client: Client,
        namespace: &str,
        block: u8,
        decide: Decide,
        options: NodeOptions,
    ) -> Result<Self> {
        let NodeOptions {
            volumes,
            job_pod_start,
            dead_gateways,
        } = options;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let taken = Arc::new(Mutex::new(Vec::new()));
        // The pods' files (gateway logs, stderr) go with the node: ~20 such directories a CI
        // run were left in /tmp. FLOE_TEST_KEEP=1 keeps them.
        let (dir, dir_guard) = crate::scratch_dir("the played kubelet")?;
        let ns = namespace.to_string();
        let seen = taken.clone();
        let task = tokio::spawn(async move {
            // Like a real kubelet, the node watches its pods rather than listing them: a LIST
            // of every pod ten times a second loaded the shared apiserver the operator is
            // measured against.
            let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let (store, writer) = reflector::store::<Pod>();
            let changed = Arc::new(tokio::sync::Notify::new());
            let notify = changed.clone();
            let watch = tokio::spawn(
                watcher(
                    pods_api,
                    watcher::Config::default().labels("app.kubernetes.io/managed-by=floe"),
                )
                .default_backoff()
                .reflect(writer)
                .for_each(move |_| {
                    notify.notify_one();
                    futures::future::ready(())
                }),
            );
            let _abort_watch = AbortOnDrop(watch);
            store.wait_until_ready().await?;
            let mut node = Node {
                store,
                changed: changed.clone(),
                pods: Api::namespaced(client.clone(), &ns),
                secrets: Api::namespaced(client, &ns),
                running: HashMap::new(),
                aux: Default::default(),
                next_aux: 0,
                next_ip: 1,
                block,
                dir,
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(5))
                    .build()?,
                decide,
                taken: seen,
                volumes,
                job_pod_start,
                dead_gateways,
                processes: Vec::new(),
                _dir_guard: dir_guard,
            };
            loop {
                if let Err(e) = node.sync().await {
                    // Keep going (an apiserver hiccup); the test's own checks will fail if it matters.
                    eprintln!("fake kubelet: {e:#}");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {},
                    _ = changed.notified() => {},
                    _ = stopped.changed() => return Ok(()),
                }
            }
        });
        Ok(Self { stop, task, taken })
    }

    /// The assignments runners took, in order.
    pub fn taken(&self) -> Vec<Value> {
        self.taken.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// How many assignments runners took so far.
    pub fn taken_count(&self) -> usize {
        self.taken.lock().map(|t| t.len()).unwrap_or_default()
    }

    /// Stops the node; the pods' gateways go with it. Fails if the loop failed.
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(true);
        self.task.await?
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Node {
    /// The namespace's floe pods, kept by a watch.
    store: Store<Pod>,
    /// Wakes the sync loop (a watch event, an assignment taken).
    changed: Arc<tokio::sync::Notify>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    running: HashMap<String, Running>,
    /// Job pods reported running, and sandbox pods reported unable to pull, by UID.
    aux: std::collections::HashSet<String>,
    next_aux: u32,
    next_ip: u32,
    block: u8,
    dir: PathBuf,
    http: reqwest::Client,
    decide: Decide,
    taken: Arc<Mutex<Vec<Value>>>,
    volumes: HashMap<String, PathBuf>,
    job_pod_start: Duration,
    dead_gateways: bool,
    /// Job pods' processes, killed with the node.
    processes: Vec<KillOnDrop>,
    /// Removes `dir` when the node goes, after its processes (fields drop in order).
    _dir_guard: Option<tempfile::TempDir>,
}

/// The runner's wait for its assignment, as `floe sandbox` does it: one long poll at a time on
/// the pod's gateway, so a pod waiting costs nothing. (Polling every claimed pod on each sync
/// made the node's own requests a burst's largest CPU load.)
/// A pod's `floe` container as this node can run it: the command and arguments the operator
/// wrote, with its listen addresses moved to the pod's IP and each volume mount to a directory
/// of the pod's own under `root` (a Secret volume's files written there), and its plain
/// environment. A flag the operator passes that the binary does not take fails here as it
/// would on a kubelet.
fn pod_container_command(
    pod: &Pod,
    container: &k8s_openapi::api::core::v1::Container,
    ip: &str,
    root: &std::path::Path,
    secret: &Secret,
) -> Result<Command> {
    anyhow::ensure!(
        container.command.as_deref() == Some(&["floe".to_string()][..]),
        "container {} does not run floe: {:?}",
        container.name,
        container.command
    );
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    let mut mounts = Vec::new();
    for m in container.volume_mounts.iter().flatten() {
        let dir = root.join(&m.name);
        std::fs::create_dir_all(&dir)?;
        let from_secret = volumes
            .iter()
            .find(|v| v.name == m.name)
            .and_then(|v| v.secret.as_ref())
            .is_some_and(|s| s.secret_name.as_deref() == secret.metadata.name.as_deref());
        if from_secret {
            for (key, value) in secret.data.iter().flatten() {
                std::fs::write(dir.join(key), &value.0)?;
            }
        }
        mounts.push((m.mount_path.clone(), dir));
    }
    let args = container.args.iter().flatten().map(|a| {
        let mut a = a
            .replace("0.0.0.0:", &format!("{ip}:"))
            .replace("127.0.0.1:", &format!("{ip}:"));
        for (path, dir) in &mounts {
            if let Some(rest) = a.strip_prefix(path.as_str()) {
                a = format!("{}{rest}", dir.display());
            }
        }
        a
    });
    let mut command = Command::new(floe_bin()?);
    command.args(args);
    for e in container.env.iter().flatten() {
        if let Some(value) = &e.value {
            command.env(&e.name, value);
        }
    }
    Ok(command)
}

async fn take_assignment(
    http: reqwest::Client,
    control: String,
    token: String,
    slot: Arc<Mutex<Option<Value>>>,
    taken: Arc<Mutex<Vec<Value>>>,
    changed: Arc<tokio::sync::Notify>,
) {
    loop {
        let reply = http
            .get(format!("{control}/floe/v1/assignments/next?waitSeconds=30"))
            .bearer_auth(&token)
            .timeout(Duration::from_secs(40))
            .send()
            .await;
        let delivered = match reply {
            Ok(r) if r.status() == reqwest::StatusCode::OK => r.json::<Value>().await.ok(),
            Ok(r) if r.status() == reqwest::StatusCode::NO_CONTENT => continue,
            _ => None,
        };
        let Some(delivered) = delivered else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let assignment = delivered["assignment"].clone();
        if let Ok(mut t) = taken.lock() {
            t.push(assignment.clone());
        }
        if let Ok(mut s) = slot.lock() {
            *s = Some(assignment);
        }
        changed.notify_one();
        return;
    }
}

/// Images under this registry name are never found: a pod whose sandbox runs one stays
/// Pending with `ErrImagePull`, as on a real node.
pub const UNPULLABLE_REGISTRY: &str = "missing.invalid/";

fn unpullable_image(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "sandbox")?
        .image
        .clone()
        .filter(|i| i.starts_with(UNPULLABLE_REGISTRY))
}

/// A pool's pod or a `poolTemplate` job's own session pod: both run the gateway sidecar.
fn is_sandbox_pod(pod: &Pod) -> bool {
    pod.labels().contains_key("floe.dev/pool")
        || pod.spec.as_ref().is_some_and(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .any(|c| c.name == "floe-gateway")
        })
}

impl Node {
    async fn sync(&mut self) -> Result<()> {
        // Shared, not cloned: this runs on every watch event, and a burst brings dozens.
        let pods: Vec<Arc<Pod>> = self.store.state();
        // Pods that are gone or going: their containers stop.
        let alive = |name: &String| {
            pods.iter()
                .any(|p| p.name_any() == *name && p.metadata.deletion_timestamp.is_none())
        };
        self.running.retain(|name, _| alive(name));
        // A job pod made again under its old name (a replaced trainer pod) is another UID: it
        // is started again, however the watch events of the two came together.
        self.aux.retain(|uid| {
            pods.iter().any(|p| {
                p.metadata.uid.as_deref() == Some(uid.as_str())
                    && p.metadata.deletion_timestamp.is_none()
            })
        });
        for pod in &pods {
            let name = pod.name_any();
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if self
                .aux
                .contains(pod.metadata.uid.as_deref().unwrap_or_default())
            {
                continue;
            }
            if !self.running.contains_key(&name) {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if matches!(phase, None | Some("Pending")) {
                    if is_sandbox_pod(pod) {
                        self.start_pod(pod).await?;
                    } else {
                        self.start_job_pod(pod).await?;
                    }
                }
                continue;
            }
            if pod.labels().get("floe.dev/state").map(String::as_str) == Some("claimed") {
                self.run_session(&name).await?;
            }
        }
        Ok(())
    }

    async fn start_pod(&mut self, pod: &Pod) -> Result<()> {
        let name = pod.name_any();
        if let Some(image) = unpullable_image(pod) {
            // As a kubelet reports an image no registry has: Pending, the container waiting.
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if self.aux.insert(uid) {
                let message = format!("failed to pull and unpack image \"{image}\": not found");
                let waiting = json!({"waiting": {"reason": "ErrImagePull", "message": message}});
                self.patch_status(
                    &name,
                    &json!({"status": {"phase": "Pending",
                        "containerStatuses": [container("sandbox", waiting)]}}),
                )
                .await?;
            }
            return Ok(());
        }
        let Some(secret) = self.secrets.get_opt(&format!("{name}-control")).await? else {
            return Ok(()); // the operator creates it right after the pod
        };
        let token = secret
            .data
            .as_ref()
            .and_then(|d| {
                d.get("control-token")
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            })
            .context("control token")?;
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "floe-gateway"))
            .context("the pod has a floe-gateway container")?;
        let control_port = container
            .ports
            .as_ref()
            .and_then(|p| p.iter().find(|p| p.name.as_deref() == Some("floe-control")))
            .map(|p| p.container_port)
            .context("the pod declares the gateway's control port")?;
        let n = self.next_ip;
        self.next_ip += 1;
        let ip = format!("127.{}.{}.{}", self.block, n / 250, n % 250 + 1);
        let root = self.dir.join(&name);
        std::fs::create_dir_all(&root)?;
        let log = std::fs::File::create(root.join("gateway.log"))?;
        let gateway = pod_container_command(pod, container, &ip, &root, &secret)?
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let control = format!("http://{ip}:{control_port}");
        let assignment = Arc::new(Mutex::new(None));
        let runner = tokio::spawn(take_assignment(
            self.http.clone(),
            control.clone(),
            token,
            assignment.clone(),
            self.taken.clone(),
            self.changed.clone(),
        ));
        let mut running = Running {
            _gateway: Some(KillOnDrop(gateway)),
            assignment,
            _runner: AbortOnDrop(runner),
            done: false,
        };
        let mut up = false;
        for _ in 0..100 {
            if self
                .http
                .get(format!("{control}/healthz"))
                .send()
                .await
                .is_ok()
            {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::ensure!(up, "the gateway of {name} did not come up at {control}");
        if self.dead_gateways {
            // Killed, and waited for: its port answers nothing from here on.
            running._gateway = None;
        }
        self.running.insert(name.clone(), running);
        let containers = ["sandbox".to_string(), "floe-gateway".to_string()];
        self.patch_status(&name, &running_status(&ip, &containers, true))
            .await
    }

    /// A job's own pod (trainer, dataset collector): reported Running and Ready on an address of
    /// its own; nothing runs there unless the test serves it.
    async fn start_job_pod(&mut self, pod: &Pod) -> Result<()> {
        let name = pod.name_any();
        self.next_aux += 1;
        let ip = format!("127.{}.255.{}", self.block, self.next_aux);
        let names: Vec<String> = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(command) = self.runnable(pod, &ip) {
            // As a kubelet: a container whose Secret is missing waits for it (retried).
            let env = self.container_env(pod).await?;
            self.aux.insert(uid);
            return self.run_job_pod(&name, &ip, &names, command, env).await;
        }
        let status = running_status(&ip, &names, true);
        self.aux.insert(uid);
        if self.job_pod_start.is_zero() {
            return self.patch_status(&name, &status).await;
        }
        // Its containers run at once (the image is here) and it gets Ready later, as a trainer
        // loading its model does: reported later without holding up this node's other pods.
        self.patch_status(&name, &running_status(&ip, &names, false))
            .await?;
        let (pods, wait) = (self.pods.clone(), self.job_pod_start);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if let Err(e) = patch_pod_status(&pods, &name, &status).await {
                eprintln!("fake kubelet: {name} Ready: {e}");
            }
        });
        Ok(())
    }

    /// A job pod's container environment, as a kubelet resolves it: plain values, and those
    /// from a Secret's key (the job's token), read when the container starts.
    async fn container_env(&self, pod: &Pod) -> Result<Vec<(String, String)>> {
        let mut env = Vec::new();
        let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
        for e in containers
            .unwrap_or_default()
            .iter()
            .flat_map(|c| c.env.iter().flatten())
        {
            if let Some(value) = &e.value {
                env.push((e.name.clone(), value.clone()));
                continue;
            }
            let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            else {
                continue;
            };
            let secret = self.secrets.get(&r.name).await.with_context(|| {
                format!(
                    "{}: its env {} from Secret {}",
                    pod.name_any(),
                    e.name,
                    r.name
                )
            })?;
            let value = secret
                .data
                .as_ref()
                .and_then(|d| d.get(&r.key))
                .with_context(|| format!("Secret {} has no key {}", r.name, r.key))?;
            env.push((
                e.name.clone(),
                String::from_utf8_lossy(&value.0).into_owned(),
            ));
        }
        Ok(env)
    }

    /// The `floe` arguments of a job pod that can really run here, rewritten for this node.
    fn runnable(&self, pod: &Pod, ip: &str) -> Option<Vec<String>> {
        let spec = pod.spec.as_ref()?;
        let [c] = spec.containers.as_slice() else {
            return None;
        };
        if c.command.as_deref() != Some(&["floe".to_string()][..]) {
            return None;
        }
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for v in spec.volumes.iter().flatten() {
            let Some(claim) = &v.persistent_volume_claim else {
                continue;
            };
            let dir = self.volumes.get(&claim.claim_name)?;
            for m in c
                .volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name == v.name)
            {
                mounts.push((m.mount_path.clone(), dir.clone()));
            }
        }
        if mounts.is_empty() {
            return None;
        }
        Some(
            c.args
                .iter()
                .flatten()
                .map(|a| {
                    let mut a = a.replace("0.0.0.0:", &format!("{ip}:"));
                    for (path, dir) in &mounts {
                        if let Some(rest) = a.strip_prefix(path.as_str()) {
                            a = format!("{}{rest}", dir.display());
                        }
                    }
                    a
                })
                .collect(),
        )
    }

    async fn run_job_pod(
        &mut self,
        name: &str,
        ip: &str,
        containers: &[String],
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<()> {
        let stderr = self.dir.join(format!("{name}.stderr"));
        let mut child = Command::new(floe_bin()?)
            .args(&args)
            .envs(env)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()?;
        let port = args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("{ip}:")))
            .unwrap_or("8100")
            .to_string();
        let mut ready = false;
        for _ in 0..100 {
            if let Some(exit) = child.try_wait()? {
                let message = std::fs::read_to_string(&stderr).unwrap_or_default();
                let crashed: Vec<Value> = containers.iter().map(|n| json!({
                    "name": n, "ready": false, "restartCount": 1, "image": "test", "imageID": "",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": exit.code().unwrap_or(1), "message": message}},
                })).collect();
                return self
                    .patch_status(name, &pod_status(ip, false, crashed))
                    .await;
            }
            if self
                .http
                .get(format!("http://{ip}:{port}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.processes.push(KillOnDrop(child));
        anyhow::ensure!(ready, "job pod {name} never answered /healthz");
        self.patch_status(name, &running_status(ip, containers, true))
            .await
    }

    /// Play the runner: take the delivered assignment (if any yet) and end the container.
    async fn run_session(&mut self, name: &str) -> Result<()> {
        let Some(r) = self.running.get(name) else {
            return Ok(());
        };
        if r.done {
            return Ok(());
        }
        let taken = r.assignment.lock().map(|a| a.clone()).unwrap_or_default();
        let Some(assignment) = taken else {
            return Ok(()); // not delivered yet
        };
        let session = assignment["session"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (exit, summary) = match (self.decide)(&assignment) {
            Verdict::Hang => return Ok(()),
            Verdict::Evicted { message } => {
                if let Some(r) = self.running.get_mut(name) {
                    r.done = true;
                }
                let killed = json!({"terminated": {"exitCode": 137, "reason": "Error"}});
                let status = json!({"status": {
                    "phase": "Failed", "reason": "Evicted", "message": message,
                    "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-22T00:00:00Z"}],
                    "containerStatuses": [container("sandbox", killed.clone()),
                                          container("floe-gateway", killed)],
                }});
                return self.patch_status(name, &status).await;
            }
            Verdict::Scored { exit, reward } => (
                exit,
                // Each attempt reports the model-server failures its gateway met: one retried
                // 503 for a scored one, one failed connection for an infrastructure one.
                json!({"session": session, "status": "completed", "reward": reward, "shipment": "shipped",
                       "agentSeconds": 0.1, "evaluatorSeconds": 0.1, "completions": 1,
                       "sampledTokens": 10, "trainableTokens": 10, "traces": 1,
                       "upstreamErrors": {"retried": {"http_503": 1}}}),
            ),
            Verdict::Sampled { reward, versions } => (
                0,
                json!({"session": session, "status": "completed", "reward": reward, "shipment": "none",
                       "agentSeconds": 0.1, "evaluatorSeconds": 0.1, "completions": 1,
                       "sampledTokens": 10, "trainableTokens": 10, "traces": 1,
                       "policyVersions": versions}),
            ),
            Verdict::Infra { error } => (
                3,
                json!({"session": session, "status": "infra_error", "reward": null, "error": error,
                       "shipment": "shipped", "agentSeconds": 0.1, "evaluatorSeconds": 0.0,
                       "completions": 0, "sampledTokens": 0, "trainableTokens": 0, "traces": 0,
                       "upstreamErrors": {"failed": {"connect": 1}}}),
            ),
        };
        if let Some(r) = self.running.get_mut(name) {
            r.done = true;
        }
        let terminated = json!({"terminated": {"exitCode": exit, "reason": if exit == 0 {"Completed"} else {"Error"},
                                "message": summary.to_string()}});
        let status = json!({"status": {
            "phase": if exit == 0 { "Succeeded" } else { "Failed" },
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-22T00:00:00Z"}],
            "containerStatuses": [container("sandbox", terminated),
                                  container("floe-gateway", json!({"terminated": {"exitCode": 0}}))],
        }});
        self.patch_status(name, &status).await
    }

    async fn patch_status(&self, name: &str, status: &Value) -> Result<()> {
        patch_pod_status(&self.pods, name, status).await
    }
}

/// Whether a pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Write a pod's status; a pod already gone (deleted meanwhile) is not an error.
async fn patch_pod_status(pods: &Api<Pod>, name: &str, status: &Value) -> Result<()> {
    match pods
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A running pod's status patch: its IP, Ready as given, these container statuses.
fn pod_status(ip: &str, ready: bool, containers: Vec<Value>) -> Value {
    json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        // Now, as a kubelet writes it: the operator bounds how long a job waits on a pod
        // that is not Ready from it.
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                        "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::now())}],
        "containerStatuses": containers,
    }})
}

/// Running, every container running; the pod and its containers Ready as given (not Ready:
/// started, readiness not yet passing).
fn running_status(ip: &str, containers: &[String], ready: bool) -> Value {
    let running = containers
        .iter()
        .map(|n| {
            let mut c = container(n, json!({"running": {}}));
            c["ready"] = json!(ready);
            c
        })
        .collect();
    pod_status(ip, ready, running)
}

fn container(name: &str, state: Value) -> Value {
    json!({"name": name, "ready": state.get("running").is_some(), "restartCount": 0,
           "image": "test", "imageID": "", "state": state})
}
