//! The genuine kube-apiserver + etcd + kube-controller-manager the integration tests use.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use floe_crds::generate::{crds, Target};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Where the tests find the control plane and Debian's kubectl 1.20.
#[derive(Clone)]
pub struct TestCluster {
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

static CLUSTER: OnceLock<TestCluster> = OnceLock::new();

/// The workspace root (each of its crates lives one level below it): of the checkout cargo
/// runs the tests in (its `CARGO_MANIFEST_DIR` at run time), else the one this was compiled in.
/// Two checkouts share one cargo target (`scripts/env.sh`), and cargo reuses a library built
/// in the other when this one's files are older: the compiled-in path then named the other
/// checkout (a CI clone), whose files and `floe` the tests used.
pub fn workspace_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
        crate_dir
            .parent()
            .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
    })
}

/// The control plane for this test process, started or reused once. Panics (fails the test)
/// when it cannot be had: these tests must never pass by skipping.
pub fn cluster() -> &'static TestCluster {
    CLUSTER.get_or_init(|| match start_or_reuse() {
        Ok(c) => c,
        Err(e) => panic!("no test control plane: {e:#}"),
    })
}

fn script(name: &str) -> PathBuf {
    workspace_root()
        .join("scripts/kube-test-cluster")
        .join(name)
}

fn run_script(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run script")?;
    if !out.status.success() {
        bail!("{:?} failed with {}", cmd, out.status);
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

fn start_or_reuse() -> Result<TestCluster> {
    let bin_dir = match std::env::var_os("FLOE_KAPI_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(run_script(&mut Command::new(script("setup.sh")))?),
    };
    let kubeconfig = match std::env::var_os("FLOE_TEST_KUBECONFIG") {
        Some(path) => PathBuf::from(path),
        None => {
            let state = workspace_root().join("target/kapi-test");
            PathBuf::from(run_script(
                Command::new(script("start.sh"))
                    .arg(&state)
                    .env("KAPI_BIN", &bin_dir),
            )?)
        }
    };
    if !kubeconfig.is_file() {
        bail!("kubeconfig {} does not exist", kubeconfig.display());
    }
    Ok(TestCluster {
        kubeconfig,
        kubectl: bin_dir.join("kubectl"),
    })
}

impl TestCluster {
    /// A kube client for the admin user. Make one per test: a client belongs to the tokio
    /// runtime it was made on, and every `#[tokio::test]` has its own.
    pub async fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// The admin user's client configuration, for a client built otherwise.
    pub async fn config(&self) -> Result<Config> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// Run Debian's kubectl 1.20 against the test cluster, optionally feeding `stdin`.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Output> {
        let mut cmd = Command::new(&self.kubectl);
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run {}", self.kubectl.display()))?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input)?;
        }
        Ok(child.wait_with_output()?)
    }

    /// The CRD target matching the apiserver's version (1.20 here: no CEL).
    pub async fn crd_target(&self, client: &Client) -> Result<Target> {
        let info = client.apiserver_version().await?;
        Ok(Target::for_kube_version(&format!(
            "{}.{}",
            info.major, info.minor
        ))?)
    }

    /// Install (server-side apply, idempotent) both CRDs and wait until they are Established.
    pub async fn install_crds(&self, client: &Client) -> Result<Vec<CustomResourceDefinition>> {
        self.install_crds_edited(client, |_| Ok(())).await
    }

    /// As [`TestCluster::install_crds`], each CRD as `edit` leaves it (an older release's, on a
    /// [`PrivateCluster`]: CRDs are the whole cluster's).
    pub async fn install_crds_edited(
        &self,
        client: &Client,
        edit: impl Fn(&mut CustomResourceDefinition) -> Result<()>,
    ) -> Result<Vec<CustomResourceDefinition>> {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let target = self.crd_target(client).await?;
        let params = PatchParams::apply("floe-tests").force();
        let mut installed = Vec::new();
        for mut crd in crds(target)? {
            edit(&mut crd)?;
            let name = crd.metadata.name.clone().context("CRD has a name")?;
            api.patch(&name, &params, &Patch::Apply(&crd)).await?;
            installed.push(wait_established(&api, &name).await?);
        }
        Ok(installed)
    }
}

/// A control plane of one test's own (`start.sh` in a temporary directory, ~5 s), for what
/// would disturb the tests sharing [`cluster()`]: CRDs of another release. Stopped on drop.
pub struct PrivateCluster {
    pub cluster: TestCluster,
    state: tempfile::TempDir,
}

impl PrivateCluster {
    pub fn start() -> Result<Self> {
        let bin_dir = match std::env::var_os("FLOE_KAPI_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(run_script(&mut Command::new(script("setup.sh")))?),
        };
        let state = tempfile::Builder::new().prefix("floe-kapi").tempdir()?;
        let kubeconfig = PathBuf::from(run_script(
            Command::new(script("start.sh"))
                .arg(state.path())
                .env("KAPI_BIN", &bin_dir),
        )?);
        Ok(Self {
            cluster: TestCluster {
                kubeconfig,
                kubectl: bin_dir.join("kubectl"),
            },
            state,
        })
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new(script("stop.sh"))
            .arg(self.state.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
) -> Result<CustomResourceDefinition> {
    for _ in 0..100 {
        let crd = match api.get(name).await {
            Ok(crd) => Some(crd),
            // A control plane a few seconds old once failed one read with its etcd stream's
            // "unexpected EOF" (a 500): asked again, as for a CRD not yet Established.
            Err(kube::Error::Api(s)) if s.code >= 500 => None,
            Err(e) => return Err(e.into()),
        };
        let established = crd
            .as_ref()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if let Some(crd) = crd.filter(|_| established) {
            return Ok(crd);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("CRD {name} not Established after 10 s")
}

/// Path of the `floe` binary, built by the first call if needed (`cargo build -p floe`; with
/// `FLOE_BIN_PROFILE=release`, the optimized build — for benchmark figures). Later calls reuse
/// it: the fake kubelet starts a gateway process per pod, and a no-op `cargo build` costs
/// ~0.5 s of CPU (and blocked the kubelet's sync that long), per pod. `FLOE_BIN` names a
/// binary to use instead, unbuilt (an A/B of two builds in a benchmark).
pub fn floe_bin() -> Result<PathBuf> {
    static BUILT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = built.as_ref() {
        return Ok(path.clone());
    }
    let path = match std::env::var_os("FLOE_BIN") {
        Some(given) => PathBuf::from(given),
        None => build_floe()?,
    };
    *built = Some(path.clone());
    Ok(path)
}

/// The variables cargo sets for a crate it compiles or runs (not cargo's own configuration,
/// such as `CARGO_HOME` or `CARGO_TARGET_DIR`).
fn set_by_cargo_for_the_crate(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

fn build_floe() -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let release = std::env::var("FLOE_BIN_PROFILE").is_ok_and(|p| p == "release");
    let mut args = vec!["build", "--quiet", "-p", "floe"];
    if release {
        args.push("--release");
    }
    let mut build = Command::new(cargo);
    build.args(&args).current_dir(workspace_root());
    // Cargo gives a test process its crate's variables (`CARGO_MANIFEST_DIR=.../tests`, the
    // `CARGO_PKG_*`): passed on, they differ from a top-level build's, and build scripts that
    // watch them (ring's, under rustls and kube) rerun, so this build and the next top-level
    // one each recompile ring, rustls, kube and floe (~40 s apiece on a slow 2-core machine).
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_the_crate) {
            build.env_remove(name);
        }
    }
    let status = build.status()?;
    if !status.success() {
        bail!("cargo build -p floe failed");
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    Ok(target_dir.join(if release {
        "release/floe"
    } else {
        "debug/floe"
    }))
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_for_the_crate;

    #[test]
    fn the_crate_variables_cargo_sets_are_dropped_and_its_configuration_kept() {
        for set in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_CRATE_NAME",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo_for_the_crate(set), "{set}");
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "CARGO_PROFILE_DEV_DEBUG",
            "RUSTFLAGS",
        ] {
            assert!(!set_by_cargo_for_the_crate(kept), "{kept}");
        }
    }
}
