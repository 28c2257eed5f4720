//! Harness presets: for each supported harness, the config files, environment and headless
//! command that point it at the gateway with the session token, with telemetry, update checks
//! and outside lookups turned off. Sans-IO: [`launch`] returns a plan; the runner writes the
//! files and starts the process. A preset never modifies the harness itself.
//!
//! Facts each preset relies on were found by running the harnesses headless (DESIGN.md §4).

use std::path::{Path, PathBuf};

use floe_crds::common::ProviderApi;
use floe_crds::rollout_job::{HarnessPreset, HarnessSpec};
use serde_json::{json, Value};

/// What a preset needs to know about this session.
#[derive(Clone, Debug)]
pub struct PresetContext<'a> {
    /// The gateway's base URL, e.g. `http://127.0.0.1:8370` (no `/v1`).
    pub gateway_url: &'a str,
    /// The session's model-API token.
    pub token: &'a str,
    /// The harness's private home directory (config files go here).
    pub home: &'a Path,
    pub instruction: &'a str,
    pub instruction_file: &'a Path,
    /// The job's per-call response cap.
    pub max_response_tokens: u32,
}

/// How to start the harness.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    /// Set on top of the runner's own environment.
    pub env: Vec<(String, String)>,
    /// Written before the start (absolute paths under the harness home).
    pub files: Vec<(PathBuf, String)>,
    /// The API the harness will speak (what the gateway should see).
    pub api: Option<ProviderApi>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PresetError {
    #[error("harness {preset} does not speak the {api:?} API")]
    Api {
        preset: &'static str,
        api: ProviderApi,
    },
    #[error("harness.command is required for the custom preset")]
    NoCommand,
    #[error("harness.settings must be a JSON object")]
    Settings,
    #[error("cannot render the {0} config: {1}")]
    Render(&'static str, String),
}

/// The preset's command, env and config files for this session.
pub fn launch(spec: &HarnessSpec, ctx: &PresetContext) -> Result<Launch, PresetError> {
    let settings = match &spec.settings {
        None => Value::Object(Default::default()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(PresetError::Settings),
    };
    let mut launch = match spec.preset {
        HarnessPreset::Codex => codex(spec, ctx, &settings)?,
        HarnessPreset::ClaudeCode => claude_code(spec, ctx, &settings)?,
        HarnessPreset::QwenCode => qwen_code(spec, ctx, &settings)?,
        HarnessPreset::Pi => pi(spec, ctx, &settings)?,
        HarnessPreset::GeminiCli => gemini_cli(spec, ctx, &settings)?,
        HarnessPreset::Custom => {
            let (program, args) = spec.command.split_first().ok_or(PresetError::NoCommand)?;
            Launch {
                program: program.clone(),
                args: args.to_vec(),
                env: vec![],
                files: vec![],
                api: spec.api,
            }
        }
    };
    if spec.preset != HarnessPreset::Custom && !spec.command.is_empty() {
        // A replaced command keeps the preset's config and env.
        if let Some((program, args)) = spec.command.split_first() {
            launch.program = program.clone();
            launch.args = args.to_vec();
        }
    }
    launch.args.extend(spec.args.iter().cloned());
    let mut env = common_env(spec, ctx);
    env.append(&mut launch.env);
    env.extend(
        spec.env
            .iter()
            .filter_map(|e| e.value.as_ref().map(|v| (e.name.clone(), v.clone()))),
    );
    launch.env = env;
    Ok(launch)
}

/// Set for every harness, so the harness and anything it starts find the gateway, and common
/// update/telemetry switches are off.
fn common_env(spec: &HarnessSpec, ctx: &PresetContext) -> Vec<(String, String)> {
    let gw = ctx.gateway_url.trim_end_matches('/');
    [
        ("HOME", ctx.home.display().to_string()),
        ("FLOE_GATEWAY_URL", gw.to_string()),
        ("FLOE_SESSION_TOKEN", ctx.token.to_string()),
        ("FLOE_MODEL", spec.model.clone()),
        ("FLOE_INSTRUCTION", ctx.instruction.to_string()),
        (
            "FLOE_INSTRUCTION_FILE",
            ctx.instruction_file.display().to_string(),
        ),
        ("OPENAI_BASE_URL", format!("{gw}/v1")),
        ("OPENAI_API_KEY", ctx.token.to_string()),
        ("ANTHROPIC_BASE_URL", gw.to_string()),
        ("ANTHROPIC_API_KEY", ctx.token.to_string()),
        ("GOOGLE_GEMINI_BASE_URL", gw.to_string()),
        ("GEMINI_API_KEY", ctx.token.to_string()),
        ("NO_UPDATE_NOTIFIER", "1".to_string()),
        ("DO_NOT_TRACK", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// How long a harness may wait on one streamed call: a day, the longest model-call deadline a
/// job may set (`timeouts.modelCallSeconds`). The gateway keeps a stream alive while vLLM
/// works, but with a keep-alive the official SDKs skip (an SSE comment on OpenAI's APIs), and
/// Codex (300 s) and Qwen Code (240 s idle, 900 s in all) time a stream by the events their SDK
/// yields: a long generation on a loaded policy server would be abandoned and sampled again, up
/// to failing the session. The gateway's own deadline is what ends a stalled call, with an
/// error in the caller's shape.
const STREAM_WAIT_MS: u64 = 86_400_000;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn only(preset: &'static str, spec: &HarnessSpec, api: ProviderApi) -> Result<(), PresetError> {
    match spec.api {
        Some(other) if other != api => Err(PresetError::Api { preset, api: other }),
        _ => Ok(()),
    }
}

/// Recursively merge `patch` into `base` (objects merge, everything else replaces).
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn json_file(path: PathBuf, mut base: Value, settings: &Value) -> (PathBuf, String) {
    merge(&mut base, settings);
    let text = serde_json::to_string_pretty(&base).unwrap_or_default();
    (path, text)
}

/// Codex CLI: `codex exec` with a custom provider on the Responses wire API; plugins and apps
/// off (they make outside lookups), hosted web search off. The pod (or local mode's bubblewrap)
/// is the sandbox, so Codex's own is bypassed.
fn codex(spec: &HarnessSpec, ctx: &PresetContext, settings: &Value) -> Result<Launch, PresetError> {
    only("codex", spec, ProviderApi::OpenaiResponses)?;
    let gw = ctx.gateway_url.trim_end_matches('/');
    let mut config = json!({
        "model": spec.model,
        "model_provider": "floe",
        "model_providers": {"floe": {
            "name": "floe", "base_url": format!("{gw}/v1"), "wire_api": "responses",
            "env_key": "FLOE_SESSION_TOKEN",
            "stream_idle_timeout_ms": STREAM_WAIT_MS,
        }},
        "features": {"plugins": false, "apps": false, "remote_plugin": false},
        // Its hosted web search runs at OpenAI, not on vLLM: the gateway would refuse it.
        "web_search": "disabled",
    });
    merge(&mut config, settings);
    let text = toml::to_string(&config).map_err(|e| PresetError::Render("codex", e.to_string()))?;
    let codex_home = ctx.home.join(".codex");
    Ok(Launch {
        program: "codex".into(),
        args: vec![
            "exec".into(),
            "--skip-git-repo-check".into(),
            "--dangerously-bypass-approvals-and-sandbox".into(),
            ctx.instruction.to_string(),
        ],
        env: vec![("CODEX_HOME".into(), codex_home.display().to_string())],
        files: vec![(codex_home.join("config.toml"), text)],
        api: Some(ProviderApi::OpenaiResponses),
    })
}

/// Claude Code: `claude -p` against `ANTHROPIC_BASE_URL` (no `/v1`), nonessential traffic off.
/// It refuses `--dangerously-skip-permissions` as root, so tools are granted through
/// `--allowedTools` and the settings file instead, which works for any user.
fn claude_code(
    spec: &HarnessSpec,
    ctx: &PresetContext,
    settings: &Value,
) -> Result<Launch, PresetError> {
    only("claude-code", spec, ProviderApi::Anthropic)?;
    const TOOLS: &str = "Bash Edit MultiEdit Write Read Glob Grep LS NotebookEdit TodoWrite";
    let base = json!({
        "permissions": {"allow": TOOLS.split(' ').collect::<Vec<_>>(), "defaultMode": "acceptEdits"},
        "includeCoAuthoredBy": false,
    });
    let max = ctx.max_response_tokens.to_string();
    Ok(Launch {
        program: "claude".into(),
        args: vec![
            "-p".into(),
            ctx.instruction.to_string(),
            "--model".into(),
            spec.model.clone(),
            "--allowedTools".into(),
            TOOLS.into(),
            "--permission-mode".into(),
            "acceptEdits".into(),
        ],
        env: env(&[
            ("ANTHROPIC_MODEL", &spec.model),
            ("ANTHROPIC_SMALL_FAST_MODEL", &spec.model),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            // Each request says what it is for (`x-claude-code-request-class`: main,
            // subagent, compaction, …), which every capture record keeps and stats count.
            ("CLAUDE_CODE_GATEWAY_HINT_HEADERS", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_ERROR_REPORTING", "1"),
            ("CLAUDE_CODE_MAX_OUTPUT_TOKENS", &max),
        ]),
        files: vec![json_file(
            ctx.home.join(".claude/settings.json"),
            base,
            settings,
        )],
        api: Some(ProviderApi::Anthropic),
    })
}

/// Qwen Code: `qwen -p --yolo` with `--auth-type openai` (Chat, default), `openai-responses` or
/// `anthropic`; usage statistics, telemetry and update checks off in its settings file, and its
/// managed auto-memory off: on by default, it runs a memory-extraction agent (shell and file
/// tools, up to 5 turns) after the answer, before `-p` exits — calls that are not the task's,
/// trained with its reward, and writes after the agent is done.
fn qwen_code(
    spec: &HarnessSpec,
    ctx: &PresetContext,
    settings: &Value,
) -> Result<Launch, PresetError> {
    let api = spec.api.unwrap_or(ProviderApi::OpenaiChat);
    let wait = STREAM_WAIT_MS.to_string();
    let auth = match api {
        ProviderApi::OpenaiChat => "openai",
        ProviderApi::OpenaiResponses => "openai-responses",
        ProviderApi::Anthropic => "anthropic",
        ProviderApi::Gemini => {
            return Err(PresetError::Api {
                preset: "qwen-code",
                api,
            })
        }
    };
    let base = json!({
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        "memory": {"enableManagedAutoMemory": false},
    });
    Ok(Launch {
        program: "qwen".into(),
        args: vec![
            "-p".into(),
            ctx.instruction.to_string(),
            "--yolo".into(),
            "--auth-type".into(),
            auth.into(),
            "-m".into(),
            spec.model.clone(),
        ],
        env: env(&[
            ("OPENAI_MODEL", &spec.model),
            ("QWEN_STREAM_IDLE_TIMEOUT_MS", &wait),
            ("QWEN_STREAM_MAX_LIFETIME_MS", &wait),
        ]),
        files: vec![json_file(
            ctx.home.join(".qwen/settings.json"),
            base,
            settings,
        )],
        api: Some(api),
    })
}

/// Pi: a custom provider in `~/.pi/agent/models.json` on any of the four APIs, offline mode,
/// no session file. `settings` merge into the model entry (e.g. `{"contextWindow": 8192}`).
fn pi(spec: &HarnessSpec, ctx: &PresetContext, settings: &Value) -> Result<Launch, PresetError> {
    let api = spec.api.unwrap_or(ProviderApi::OpenaiChat);
    let gw = ctx.gateway_url.trim_end_matches('/');
    let (pi_api, base_url) = match api {
        ProviderApi::OpenaiChat => ("openai-completions", format!("{gw}/v1")),
        ProviderApi::Anthropic => ("anthropic-messages", gw.to_string()),
        ProviderApi::OpenaiResponses => ("openai-responses", format!("{gw}/v1")),
        ProviderApi::Gemini => ("google-generative-ai", format!("{gw}/v1beta")),
    };
    let mut model = json!({
        "id": spec.model, "contextWindow": 32768, "maxTokens": ctx.max_response_tokens,
    });
    merge(&mut model, settings);
    let models = json!({"providers": {"floe": {
        "baseUrl": base_url, "api": pi_api, "apiKey": ctx.token,
        "compat": {"supportsReasoningEffort": false},
        "models": [model],
    }}});
    Ok(Launch {
        program: "pi".into(),
        args: vec![
            "--provider".into(),
            "floe".into(),
            "--model".into(),
            spec.model.clone(),
            "-p".into(),
            "--offline".into(),
            "--no-session".into(),
            ctx.instruction.to_string(),
        ],
        env: env(&[("PI_OFFLINE", "1")]),
        files: vec![(
            ctx.home.join(".pi/agent/models.json"),
            serde_json::to_string_pretty(&models).unwrap_or_default(),
        )],
        api: Some(api),
    })
}

/// Gemini CLI: `GOOGLE_GEMINI_BASE_URL` + API key, workspace trusted, `-m` pins the model,
/// `--yolo` approves tool calls; statistics, telemetry and update checks off, and loop
/// detection off: past 30 turns it asks a model it names itself (`gemini-3-flash-preview`, not
/// `-m`'s) whether the agent loops, calls the policy would answer and be trained on.
fn gemini_cli(
    spec: &HarnessSpec,
    ctx: &PresetContext,
    settings: &Value,
) -> Result<Launch, PresetError> {
    only("gemini-cli", spec, ProviderApi::Gemini)?;
    let base = json!({
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "model": {"disableLoopDetection": true},
    });
    Ok(Launch {
        program: "gemini".into(),
        args: vec![
            "-m".into(),
            spec.model.clone(),
            "-p".into(),
            ctx.instruction.to_string(),
            "--yolo".into(),
        ],
        env: env(&[("GEMINI_CLI_TRUST_WORKSPACE", "true")]),
        files: vec![json_file(
            ctx.home.join(".gemini/settings.json"),
            base,
            settings,
        )],
        api: Some(ProviderApi::Gemini),
    })
}

/// The program a harness spec runs (`harness.command[0]`, else the preset's), so callers can
/// check it exists before any session starts. `None` for a custom preset without a command.
pub fn program(spec: &HarnessSpec) -> Option<&str> {
    if let Some(first) = spec.command.first() {
        return Some(first);
    }
    match spec.preset {
        HarnessPreset::Codex => Some("codex"),
        HarnessPreset::ClaudeCode => Some("claude"),
        HarnessPreset::QwenCode => Some("qwen"),
        HarnessPreset::Pi => Some("pi"),
        HarnessPreset::GeminiCli => Some("gemini"),
        HarnessPreset::Custom => None,
    }
}

#[cfg(test)]
mod tests;
