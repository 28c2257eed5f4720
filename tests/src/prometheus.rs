//! A real Prometheus server for the tests: Debian's `prometheus` (from `scripts/chart/tools.sh`,
//! beside promtool), listening on loopback only, scraping what the chart's ServiceMonitor and
//! PodMonitors select with the scrape configs the Prometheus Operator generates from them, and
//! evaluating the chart's own rule file. Tests read it through its HTTP API, never the targets'
//! `/metrics` pages.
//!
//! Debian builds Prometheus without its Kubernetes discovery (`kubernetes_sd_configs` is
//! unknown to it), so [`KubernetesSd`] stands in for that one part: it lists pods and
//! Endpoints from the apiserver every second and writes them, with the `__meta_kubernetes_*`
//! labels Kubernetes discovery gives (role `pod` and role `endpoints`), as file-discovery
//! targets. Selection, port choice and labelling stay Prometheus's own relabeling.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::chart::tools;

/// A running Prometheus; killed when dropped (its data is a temporary directory).
pub struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
    pub url: String,
    http: reqwest::Client,
    discovery: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(d) = &self.discovery {
            d.abort();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Start it scraping what the ServiceMonitors and PodMonitors among `docs` select in the
    /// cluster `client` reaches, with this rules file, scraping and evaluating every `interval`
    /// (a Prometheus duration); wait until it answers.
    pub async fn start_for_monitors(
        docs: &[Value],
        client: kube::Client,
        rules: &str,
        interval: &str,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("floe-prom").tempdir()?;
        let sd = dir.path().join("sd");
        std::fs::create_dir(&sd)?;
        let discovery = KubernetesSd::start(client, &sd).await?;
        let configs = scrape_configs(docs, &sd)?;
        let mut prometheus = Self::start_in(dir, &configs, rules, interval)
            .await
            .inspect_err(|_| discovery.abort())?;
        prometheus.discovery = Some(discovery);
        Ok(prometheus)
    }

    /// Start it with these scrape configs and this rules file, scraping and evaluating every
    /// `interval` (a Prometheus duration), and wait until it answers.
    pub async fn start(scrape_configs: &[Value], rules: &str, interval: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("floe-prom").tempdir()?;
        Self::start_in(dir, scrape_configs, rules, interval).await
    }

    async fn start_in(
        dir: tempfile::TempDir,
        scrape_configs: &[Value],
        rules: &str,
        interval: &str,
    ) -> Result<Self> {
        let config = json!({
            "global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": interval},
            "rule_files": [dir.path().join("rules.yaml")],
            "scrape_configs": scrape_configs,
        });
        std::fs::write(dir.path().join("rules.yaml"), rules)?;
        std::fs::write(
            dir.path().join("prometheus.yaml"),
            serde_yaml::to_string(&config)?,
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let child = Command::new(tools().join("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yaml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // Samples from a stopped target go stale at once; no lookback beyond a few scrapes.
            .arg("--query.lookback-delta=15s")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot run prometheus (scripts/chart/tools.sh provides it)")?;
        let prometheus = Self {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            discovery: None,
        };
        crate::operator::eventually_within(30, "Prometheus to be ready", async || {
            Ok(prometheus
                .http
                .get(format!("{}/-/ready", prometheus.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
                .then_some(()))
        })
        .await
        .with_context(|| prometheus.log())?;
        Ok(prometheus)
    }

    /// The last lines of its log, for a failure message.
    pub fn log(&self) -> String {
        crate::node::tail(&self.dir.path().join("prometheus.log"), 20)
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Result<Value> {
        let mut url = reqwest::Url::parse(&format!("{}/api/v1/{path}", self.url))?;
        url.query_pairs_mut().extend_pairs(query);
        let reply: Value = self.http.get(url).send().await?.json().await?;
        if reply["status"] != "success" {
            bail!("Prometheus {path} {query:?}: {reply}");
        }
        Ok(reply["data"].clone())
    }

    /// An instant query's series: each `{"metric": {labels}, "value": [t, "v"]}`.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let data = self.api("query", &[("query", expr)]).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerts now pending or firing: each with `labels`, `state`, `annotations`.
    pub async fn alerts(&self) -> Result<Vec<Value>> {
        let data = self.api("alerts", &[]).await?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// The active targets, with their `labels`, `health` and `lastError`.
    pub async fn targets(&self) -> Result<Vec<Value>> {
        let data = self.api("targets", &[("state", "active")]).await?;
        Ok(data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The firing alerts named `name` whose labels include `labels`.
    pub async fn firing(&self, name: &str, labels: &[(&str, &str)]) -> Result<Vec<Value>> {
        Ok(self
            .alerts()
            .await?
            .into_iter()
            .filter(|a| {
                a["state"] == "firing"
                    && a["labels"]["alertname"] == name
                    && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
            })
            .collect())
    }

    /// The rule groups' evaluation errors (a rule that cannot be evaluated never fires).
    pub async fn rule_errors(&self) -> Result<Vec<String>> {
        let data = self.api("rules", &[]).await?;
        let mut errors = Vec::new();
        for group in data["groups"].as_array().into_iter().flatten() {
            for rule in group["rules"].as_array().into_iter().flatten() {
                if rule["health"] != "ok" && rule["health"] != "unknown" {
                    errors.push(format!("{}: {}", rule["name"], rule["lastError"]));
                }
            }
        }
        Ok(errors)
    }

    /// The `queries` (panel title, PromQL) that return no series with the dashboard's
    /// variables replaced by `vars` (name without `$`, regex value), as "title: query".
    pub async fn panels_without_data(
        &self,
        queries: &[(String, String)],
        vars: &[(&str, &str)],
    ) -> Result<Vec<String>> {
        let mut empty = Vec::new();
        for (title, expr) in queries {
            let query = vars
                .iter()
                .fold(expr.clone(), |q, (k, v)| q.replace(&format!("${k}"), v));
            if self.query(&query).await?.is_empty() {
                empty.push(format!("{title}: {query}"));
            }
        }
        Ok(empty)
    }
}

/// A Kubernetes label name as a Prometheus meta label suffix (`floe.dev/pool` → `floe_dev_pool`).
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The `keep` relabelings that select what a label selector selects, on the meta labels of
/// `role` (`pod` or `service`).
fn selector_relabelings(selector: &Value, role: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for (key, value) in selector["matchLabels"].as_object().into_iter().flatten() {
        let k = sanitize(key);
        out.push(json!({"action": "keep",
            "source_labels": [format!("__meta_kubernetes_{role}_label_{k}"),
                              format!("__meta_kubernetes_{role}_labelpresent_{k}")],
            "regex": format!("({});true", value.as_str().context("matchLabels value")?)}));
    }
    for expr in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let k = sanitize(expr["key"].as_str().context("matchExpressions key")?);
        match expr["operator"].as_str() {
            Some("Exists") => out.push(json!({"action": "keep",
                "source_labels": [format!("__meta_kubernetes_{role}_labelpresent_{k}")],
                "regex": "true"})),
            other => bail!("selector operator {other:?} is not translated"),
        }
    }
    Ok(out)
}

/// The `keep` relabeling for the monitor's namespaces (none: every namespace).
fn namespace_relabeling(monitor: &Value) -> Option<Value> {
    let sel = &monitor["spec"]["namespaceSelector"];
    let names: Vec<&str> = if sel["any"] == true {
        return None;
    } else if let Some(names) = sel["matchNames"].as_array() {
        names.iter().filter_map(Value::as_str).collect()
    } else {
        vec![monitor["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()]
    };
    Some(
        json!({"action": "keep", "source_labels": ["__meta_kubernetes_namespace"],
                "regex": format!("({})", names.join("|"))}),
    )
}

/// A monitor's own `relabelings`, in Prometheus's spelling.
fn own_relabelings(endpoint: &Value) -> Vec<Value> {
    endpoint["relabelings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let mut out = serde_json::Map::new();
            for (k, v) in r.as_object().into_iter().flatten() {
                let key = match k.as_str() {
                    "sourceLabels" => "source_labels",
                    "targetLabel" => "target_label",
                    other => other,
                };
                out.insert(key.to_string(), v.clone());
            }
            Value::Object(out)
        })
        .collect()
}

/// The scrape configs the Prometheus Operator generates from the ServiceMonitors and
/// PodMonitors among `docs` (its `job`, `namespace`, `pod`, `container`, `service` and
/// `endpoint` labels, port-name selection and the monitors' own relabelings), their targets
/// read from [`KubernetesSd`]'s files in `sd_dir`. Other documents are ignored.
pub fn scrape_configs(docs: &[Value], sd_dir: &Path) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for monitor in docs {
        let kind = monitor["kind"].as_str().unwrap_or_default();
        let (role, endpoints_key) = match kind {
            "ServiceMonitor" => ("endpoints", "endpoints"),
            "PodMonitor" => ("pod", "podMetricsEndpoints"),
            _ => continue,
        };
        let name = monitor["metadata"]["name"]
            .as_str()
            .context("monitor name")?;
        let namespace = monitor["metadata"]["namespace"]
            .as_str()
            .context("monitor namespace")?;
        let spec = &monitor["spec"];
        let endpoints = spec[endpoints_key]
            .as_array()
            .context("monitor endpoints")?;
        for (i, endpoint) in endpoints.iter().enumerate() {
            let port = endpoint["port"].as_str().context("endpoint port")?;
            let mut relabel: Vec<Value> = namespace_relabeling(monitor).into_iter().collect();
            if role == "pod" {
                relabel.extend(selector_relabelings(&spec["selector"], "pod")?);
                relabel.push(json!({"action": "keep",
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": port}));
                relabel.push(json!({"action": "drop",
                    "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)"}));
            } else {
                relabel.extend(selector_relabelings(&spec["selector"], "service")?);
                relabel.push(json!({"action": "keep",
                    "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": port}));
                relabel.push(json!({"source_labels": ["__meta_kubernetes_service_name"],
                    "target_label": "service"}));
            }
            relabel.push(json!({"source_labels": ["__meta_kubernetes_namespace"],
                "target_label": "namespace"}));
            relabel.push(json!({"source_labels": ["__meta_kubernetes_pod_name"],
                "target_label": "pod"}));
            relabel.push(
                json!({"source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container"}),
            );
            // The job label: the Service's name for a ServiceMonitor, `<namespace>/<name>` for
            // a PodMonitor (the operator's defaults, with no jobLabel set).
            relabel.push(if role == "pod" {
                json!({"target_label": "job", "replacement": format!("{namespace}/{name}")})
            } else {
                json!({"source_labels": ["__meta_kubernetes_service_name"],
                       "target_label": "job"})
            });
            relabel.push(json!({"target_label": "endpoint", "replacement": port}));
            relabel.extend(own_relabelings(endpoint));
            let sd = json!({"files": [sd_dir.join(format!("{role}.json"))],
                            "refresh_interval": "1s"});
            let mut config = json!({
                "job_name": format!("{}/{namespace}/{name}/{i}", kind.to_ascii_lowercase()),
                "honor_labels": endpoint["honorLabels"] == true,
                "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
                "file_sd_configs": [sd],
                "relabel_configs": relabel,
            });
            if let Some(interval) = endpoint["interval"].as_str() {
                config["scrape_interval"] = interval.into();
                config["scrape_timeout"] = interval.into();
            }
            out.push(config);
        }
    }
    Ok(out)
}

/// Kubernetes discovery for a Prometheus built without it: the cluster's pods and Endpoints as
/// file-discovery targets (`pod.json`, `endpoints.json`) with the meta labels Prometheus's
/// own Kubernetes discovery gives them, rewritten every second.
pub struct KubernetesSd;

impl KubernetesSd {
    /// Write the targets in `dir` now, then every second until the task is aborted.
    pub async fn start(client: kube::Client, dir: &Path) -> Result<tokio::task::JoinHandle<()>> {
        write_targets(&client, dir).await?;
        let dir = dir.to_path_buf();
        Ok(tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                if let Err(e) = write_targets(&client, &dir).await {
                    eprintln!("kubernetes discovery for Prometheus: {e:#}");
                }
            }
        }))
    }
}

async fn list<K>(client: &kube::Client) -> Result<Vec<Value>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let items = kube::Api::<K>::all(client.clone())
        .list(&Default::default())
        .await?
        .items;
    items.iter().map(|i| Ok(serde_json::to_value(i)?)).collect()
}

async fn write_targets(client: &kube::Client, dir: &Path) -> Result<()> {
    use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
    let pods = list::<Pod>(client).await?;
    let endpoints = list::<Endpoints>(client).await?;
    let services = list::<Service>(client).await?;
    write_if_changed(&dir.join("pod.json"), &Value::from(pod_targets(&pods)))?;
    write_if_changed(
        &dir.join("endpoints.json"),
        &Value::from(endpoints_targets(&endpoints, &services, &pods)),
    )
}

/// Replace `path` (by rename: Prometheus never reads half a file) when its content changes.
fn write_if_changed(path: &Path, targets: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(targets)?;
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `__meta_kubernetes_<prefix>_label_*`/`labelpresent_*` (and the same for annotations) of
/// an object's metadata.
fn object_meta_labels(out: &mut serde_json::Map<String, Value>, prefix: &str, meta: &Value) {
    for (field, word) in [("labels", "label"), ("annotations", "annotation")] {
        for (k, v) in meta[field].as_object().into_iter().flatten() {
            let k = sanitize(k);
            out.insert(
                format!("__meta_kubernetes_{prefix}_{word}_{k}"),
                str_of(v).into(),
            );
            out.insert(
                format!("__meta_kubernetes_{prefix}_{word}present_{k}"),
                "true".into(),
            );
        }
    }
}

/// The labels Kubernetes discovery gives every target of a pod.
fn pod_labels(pod: &Value) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let meta = &pod["metadata"];
    let ready = pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    for (k, v) in [
        ("namespace", str_of(&meta["namespace"])),
        ("pod_name", str_of(&meta["name"])),
        ("pod_uid", str_of(&meta["uid"])),
        ("pod_ip", str_of(&pod["status"]["podIP"])),
        ("pod_host_ip", str_of(&pod["status"]["hostIP"])),
        ("pod_node_name", str_of(&pod["spec"]["nodeName"])),
        ("pod_phase", str_of(&pod["status"]["phase"])),
        ("pod_ready", ready.to_string()),
    ] {
        out.insert(format!("__meta_kubernetes_{k}"), v.into());
    }
    object_meta_labels(&mut out, "pod", meta);
    if let Some(owner) = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["controller"] == true)
    {
        out.insert(
            "__meta_kubernetes_pod_controller_kind".into(),
            str_of(&owner["kind"]).into(),
        );
        out.insert(
            "__meta_kubernetes_pod_controller_name".into(),
            str_of(&owner["name"]).into(),
        );
    }
    out
}

/// A container's labels, and those of one of its ports.
fn container_labels(out: &mut serde_json::Map<String, Value>, c: &Value, port: Option<&Value>) {
    out.insert(
        "__meta_kubernetes_pod_container_name".into(),
        str_of(&c["name"]).into(),
    );
    out.insert(
        "__meta_kubernetes_pod_container_image".into(),
        str_of(&c["image"]).into(),
    );
    out.insert(
        "__meta_kubernetes_pod_container_init".into(),
        "false".into(),
    );
    if let Some(p) = port {
        for (k, v) in [
            ("name", &p["name"]),
            ("number", &p["containerPort"]),
            ("protocol", &p["protocol"]),
        ] {
            out.insert(
                format!("__meta_kubernetes_pod_container_port_{k}"),
                str_of(v).into(),
            );
        }
    }
}

fn target(address: String, labels: serde_json::Map<String, Value>) -> Value {
    json!({"targets": [address], "labels": labels})
}

/// Role `pod`: a target per declared container port (a port-less one per container without
/// ports), at the pod's IP; pods without an IP have none.
pub fn pod_targets(pods: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for pod in pods {
        let Some(ip) = pod["status"]["podIP"].as_str().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        let common = pod_labels(pod);
        for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
            let ports = c["ports"].as_array().cloned().unwrap_or_default();
            if ports.is_empty() {
                let mut labels = common.clone();
                container_labels(&mut labels, c, None);
                out.push(target(ip.to_string(), labels));
            }
            for p in &ports {
                let mut labels = common.clone();
                container_labels(&mut labels, c, Some(p));
                out.push(target(
                    format!("{ip}:{}", str_of(&p["containerPort"])),
                    labels,
                ));
            }
        }
    }
    out
}

/// Role `endpoints`: a target per address and port of each Endpoints object, with its
/// Service's labels and, for a pod address, the pod's and the serving container's.
pub fn endpoints_targets(endpoints: &[Value], services: &[Value], pods: &[Value]) -> Vec<Value> {
    let key = |o: &Value| {
        (
            str_of(&o["metadata"]["namespace"]),
            str_of(&o["metadata"]["name"]),
        )
    };
    let mut out = Vec::new();
    for ep in endpoints {
        let (ns, name) = key(ep);
        let mut common = serde_json::Map::new();
        common.insert("__meta_kubernetes_namespace".into(), ns.clone().into());
        common.insert(
            "__meta_kubernetes_endpoints_name".into(),
            name.clone().into(),
        );
        if let Some(svc) = services
            .iter()
            .find(|s| key(s) == (ns.clone(), name.clone()))
        {
            common.insert("__meta_kubernetes_service_name".into(), name.clone().into());
            object_meta_labels(&mut common, "service", &svc["metadata"]);
        }
        for subset in ep["subsets"].as_array().into_iter().flatten() {
            let ready = subset["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| (a, true));
            let unready = subset["notReadyAddresses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| (a, false));
            for (address, is_ready) in ready.chain(unready) {
                let pod = (address["targetRef"]["kind"] == "Pod")
                    .then(|| {
                        pods.iter()
                            .find(|p| key(p) == (ns.clone(), str_of(&address["targetRef"]["name"])))
                    })
                    .flatten();
                for port in subset["ports"].as_array().into_iter().flatten() {
                    let mut labels = common.clone();
                    for (k, v) in [
                        ("endpoint_ready", is_ready.to_string()),
                        ("endpoint_port_name", str_of(&port["name"])),
                        ("endpoint_port_protocol", str_of(&port["protocol"])),
                        ("endpoint_node_name", str_of(&address["nodeName"])),
                        (
                            "endpoint_address_target_kind",
                            str_of(&address["targetRef"]["kind"]),
                        ),
                        (
                            "endpoint_address_target_name",
                            str_of(&address["targetRef"]["name"]),
                        ),
                    ] {
                        labels.insert(format!("__meta_kubernetes_{k}"), v.into());
                    }
                    if let Some(pod) = pod {
                        labels.extend(pod_labels(pod));
                        let serving = pod["spec"]["containers"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find_map(|c| {
                                c["ports"]
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .find(|p| p["containerPort"] == port["port"])
                                    .map(|p| (c, p))
                            });
                        if let Some((c, p)) = serving {
                            container_labels(&mut labels, c, Some(p));
                        }
                    }
                    out.push(target(
                        format!("{}:{}", str_of(&address["ip"]), str_of(&port["port"])),
                        labels,
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitors_become_the_scrape_configs_the_prometheus_operator_generates() {
        let docs = vec![
            json!({"kind": "PodMonitor", "metadata": {"name": "g", "namespace": "sys"},
                   "spec": {"selector": {"matchLabels": {"floe.dev/job-role": "trainer"},
                                         "matchExpressions": [{"key": "floe.dev/pool", "operator": "Exists"}]},
                            "namespaceSelector": {"matchNames": ["work"]},
                            "podMetricsEndpoints": [{"port": "floe-control", "path": "/metrics", "interval": "1s",
                                "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_label_floe_dev_pool"],
                                                 "targetLabel": "pool"}]}]}}),
            json!({"kind": "ServiceMonitor", "metadata": {"name": "op", "namespace": "sys"},
                   "spec": {"selector": {"matchLabels": {"app": "floe"}},
                            "namespaceSelector": {"matchNames": ["sys"]},
                            "endpoints": [{"port": "metrics", "honorLabels": true}]}}),
            json!({"kind": "Deployment"}),
        ];
        let got = scrape_configs(&docs, Path::new("/k")).expect("translates");
        assert_eq!(got.len(), 2);
        let pod = &got[0];
        assert_eq!(pod["job_name"], "podmonitor/sys/g/0");
        assert_eq!(pod["scrape_interval"], "1s");
        assert_eq!(pod["file_sd_configs"][0]["files"][0], "/k/pod.json");
        let relabel = pod["relabel_configs"].as_array().expect("relabelings");
        assert_eq!(relabel[0]["regex"], "(work)");
        assert_eq!(relabel[1]["regex"], "(trainer);true");
        assert_eq!(
            relabel[2]["source_labels"][0],
            "__meta_kubernetes_pod_labelpresent_floe_dev_pool"
        );
        assert!(relabel
            .iter()
            .any(|r| r["target_label"] == "job" && r["replacement"] == "sys/g"));
        assert_eq!(relabel.last().expect("own")["target_label"], "pool");
        let svc = &got[1];
        assert_eq!(svc["honor_labels"], true);
        assert_eq!(svc["file_sd_configs"][0]["files"][0], "/k/endpoints.json");
        assert!(svc["relabel_configs"]
            .as_array()
            .expect("relabelings")
            .iter()
            .any(|r| r["target_label"] == "job"
                && r["source_labels"][0] == "__meta_kubernetes_service_name"));
        let bad = json!({"kind": "PodMonitor", "metadata": {"name": "g", "namespace": "s"},
            "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]},
                     "podMetricsEndpoints": [{"port": "p"}]}});
        assert!(scrape_configs(&[bad], Path::new("/k")).is_err());
    }

    #[test]
    fn pods_and_endpoints_get_the_meta_labels_kubernetes_discovery_gives() {
        let pod = json!({"metadata": {"namespace": "ns", "name": "p", "labels": {"floe.dev/pool": "py"},
                                      "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": true}]},
                         "spec": {"nodeName": "n", "containers": [
                             {"name": "gw", "image": "floe", "ports": [{"name": "floe-control", "containerPort": 8371, "protocol": "TCP"}]},
                             {"name": "sandbox", "image": "py"}]},
                         "status": {"podIP": "10.0.0.5", "phase": "Running",
                                    "conditions": [{"type": "Ready", "status": "True"}]}});
        let unscheduled = json!({"metadata": {"namespace": "ns", "name": "q"}, "spec": {"containers": [{"name": "c"}]}, "status": {}});
        let got = pod_targets(&[pod.clone(), unscheduled]);
        assert_eq!(
            got.len(),
            2,
            "a port target and a port-less one; none without an IP"
        );
        assert_eq!(got[0]["targets"][0], "10.0.0.5:8371");
        let l = &got[0]["labels"];
        assert_eq!(l["__meta_kubernetes_pod_label_floe_dev_pool"], "py");
        assert_eq!(
            l["__meta_kubernetes_pod_labelpresent_floe_dev_pool"],
            "true"
        );
        assert_eq!(
            l["__meta_kubernetes_pod_container_port_name"],
            "floe-control"
        );
        assert_eq!(l["__meta_kubernetes_pod_ready"], "true");
        assert_eq!(l["__meta_kubernetes_pod_controller_kind"], "ReplicaSet");
        assert_eq!(got[1]["targets"][0], "10.0.0.5");

        let svc = json!({"metadata": {"namespace": "ns", "name": "m", "labels": {"app": "floe"}}});
        let ep = json!({"metadata": {"namespace": "ns", "name": "m"},
                        "subsets": [{"addresses": [{"ip": "10.0.0.5", "targetRef": {"kind": "Pod", "name": "p"}}],
                                     "notReadyAddresses": [{"ip": "10.0.0.6"}],
                                     "ports": [{"name": "metrics", "port": 8371, "protocol": "TCP"}]}]});
        let got = endpoints_targets(&[ep], &[svc], &[pod]);
        assert_eq!(got.len(), 2);
        let l = &got[0]["labels"];
        assert_eq!(got[0]["targets"][0], "10.0.0.5:8371");
        assert_eq!(l["__meta_kubernetes_service_label_app"], "floe");
        assert_eq!(l["__meta_kubernetes_endpoint_port_name"], "metrics");
        assert_eq!(l["__meta_kubernetes_pod_name"], "p");
        assert_eq!(l["__meta_kubernetes_pod_container_name"], "gw");
        assert_eq!(
            got[1]["labels"]["__meta_kubernetes_endpoint_ready"],
            "false"
        );
    }
}
