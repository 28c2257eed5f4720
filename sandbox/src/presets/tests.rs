use std::path::Path;

use floe_crds::common::ProviderApi;
use floe_crds::rollout_job::{HarnessPreset, HarnessSpec};
use k8s_openapi::api::core::v1::EnvVar;
use serde_json::{json, Value};

use super::*;

fn spec(preset: HarnessPreset) -> HarnessSpec {
    serde_json::from_value(json!({"preset": preset})).expect("spec")
}

fn ctx(home: &Path) -> PresetContext<'_> {
    PresetContext {
        gateway_url: "http://127.0.0.1:8370/",
        token: "floe-tok",
        home,
        instruction: "Fix the bug.",
        instruction_file: Path::new("/state/instruction.md"),
        max_response_tokens: 512,
    }
}

fn env_of<'a>(launch: &'a Launch, key: &str) -> Option<&'a str> {
    launch
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn file_json(launch: &Launch, suffix: &str) -> Value {
    let (_, text) = launch
        .files
        .iter()
        .find(|(p, _)| p.ends_with(suffix))
        .unwrap_or_else(|| panic!("no {suffix} in {:?}", launch.files));
    serde_json::from_str(text).expect("json config")
}

#[test]
fn every_preset_points_the_harness_at_the_gateway_with_the_session_token() {
    let home = Path::new("/home/agent");
    for preset in [
        HarnessPreset::Codex,
        HarnessPreset::ClaudeCode,
        HarnessPreset::QwenCode,
        HarnessPreset::Pi,
        HarnessPreset::GeminiCli,
    ] {
        let launch = launch(&spec(preset), &ctx(home)).expect("launch");
        assert_eq!(env_of(&launch, "HOME"), Some("/home/agent"), "{preset:?}");
        assert_eq!(
            env_of(&launch, "OPENAI_BASE_URL"),
            Some("http://127.0.0.1:8370/v1")
        );
        assert_eq!(
            env_of(&launch, "ANTHROPIC_BASE_URL"),
            Some("http://127.0.0.1:8370")
        );
        assert_eq!(env_of(&launch, "FLOE_SESSION_TOKEN"), Some("floe-tok"));
        assert!(
            launch.args.iter().any(|a| a == "Fix the bug."),
            "{preset:?} must pass the instruction: {:?}",
            launch.args
        );
        for (path, _) in &launch.files {
            assert!(
                path.starts_with(home),
                "{preset:?} writes outside its home: {path:?}"
            );
        }
    }
}

#[test]
fn codex_gets_a_responses_provider_with_outside_lookups_off() {
    let launch = launch(&spec(HarnessPreset::Codex), &ctx(Path::new("/h"))).expect("launch");
    assert_eq!(launch.program, "codex");
    assert_eq!(&launch.args[..2], ["exec", "--skip-git-repo-check"]);
    assert_eq!(env_of(&launch, "CODEX_HOME"), Some("/h/.codex"));
    let (path, text) = &launch.files[0];
    assert_eq!(path, Path::new("/h/.codex/config.toml"));
    let config: toml::Value = toml::from_str(text).expect("toml");
    let provider = &config["model_providers"]["floe"];
    assert_eq!(
        provider["base_url"].as_str(),
        Some("http://127.0.0.1:8370/v1")
    );
    assert_eq!(provider["wire_api"].as_str(), Some("responses"));
    assert_eq!(provider["env_key"].as_str(), Some("FLOE_SESSION_TOKEN"));
    assert_eq!(config["model_provider"].as_str(), Some("floe"));
    assert_eq!(config["features"]["plugins"].as_bool(), Some(false));
    assert_eq!(config["features"]["apps"].as_bool(), Some(false));
    // Codex times a stream by the events it parses; the gateway's keep-alive is none.
    assert_eq!(
        provider["stream_idle_timeout_ms"].as_integer(),
        Some(86_400_000)
    );
}

#[test]
fn claude_code_avoids_the_root_refused_flag_and_nonessential_traffic() {
    let launch = launch(&spec(HarnessPreset::ClaudeCode), &ctx(Path::new("/h"))).expect("launch");
    assert_eq!(launch.program, "claude");
    assert!(!launch
        .args
        .iter()
        .any(|a| a == "--dangerously-skip-permissions"));
    assert!(launch.args.iter().any(|a| a == "--allowedTools"));
    assert_eq!(
        env_of(&launch, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"),
        Some("1")
    );
    assert_eq!(
        env_of(&launch, "CLAUDE_CODE_MAX_OUTPUT_TOKENS"),
        Some("512")
    );
    let settings = file_json(&launch, ".claude/settings.json");
    assert!(settings["permissions"]["allow"]
        .as_array()
        .is_some_and(|a| a.iter().any(|t| t == "Bash")));
}

#[test]
fn qwen_code_maps_each_api_to_its_auth_type_and_refuses_gemini() {
    for (api, auth) in [
        (None, "openai"),
        (Some(ProviderApi::OpenaiResponses), "openai-responses"),
        (Some(ProviderApi::Anthropic), "anthropic"),
    ] {
        let mut s = spec(HarnessPreset::QwenCode);
        s.api = api;
        let launch = launch(&s, &ctx(Path::new("/h"))).expect("launch");
        let i = launch
            .args
            .iter()
            .position(|a| a == "--auth-type")
            .expect("--auth-type");
        assert_eq!(launch.args[i + 1], auth);
        let settings = file_json(&launch, ".qwen/settings.json");
        assert_eq!(settings["telemetry"]["enabled"], false);
        // No memory-extraction agent after the answer.
        assert_eq!(settings["memory"]["enableManagedAutoMemory"], false);
        // Its stream guards count chunks, which the gateway's keep-alive is not.
        for guard in ["QWEN_STREAM_IDLE_TIMEOUT_MS", "QWEN_STREAM_MAX_LIFETIME_MS"] {
            assert_eq!(env_of(&launch, guard), Some("86400000"), "{guard}");
        }
    }
    let mut s = spec(HarnessPreset::QwenCode);
    s.api = Some(ProviderApi::Gemini);
    assert!(matches!(
        launch(&s, &ctx(Path::new("/h"))),
        Err(PresetError::Api { .. })
    ));
}

#[test]
fn pi_speaks_every_api_and_merges_settings_into_its_model() {
    for (api, pi_api, base) in [
        (
            ProviderApi::OpenaiChat,
            "openai-completions",
            "http://127.0.0.1:8370/v1",
        ),
        (
            ProviderApi::Anthropic,
            "anthropic-messages",
            "http://127.0.0.1:8370",
        ),
        (
            ProviderApi::OpenaiResponses,
            "openai-responses",
            "http://127.0.0.1:8370/v1",
        ),
        (
            ProviderApi::Gemini,
            "google-generative-ai",
            "http://127.0.0.1:8370/v1beta",
        ),
    ] {
        let mut s = spec(HarnessPreset::Pi);
        s.api = Some(api);
        s.settings = Some(json!({"contextWindow": 8192}));
        let launch = launch(&s, &ctx(Path::new("/h"))).expect("launch");
        let models = file_json(&launch, ".pi/agent/models.json");
        let provider = &models["providers"]["floe"];
        assert_eq!(provider["api"], pi_api);
        assert_eq!(provider["baseUrl"], base);
        assert_eq!(provider["apiKey"], "floe-tok");
        assert_eq!(provider["models"][0]["contextWindow"], 8192);
        assert_eq!(provider["models"][0]["maxTokens"], 512);
        assert_eq!(launch.api, Some(api));
    }
}

#[test]
fn gemini_cli_pins_the_model_and_trusts_the_workspace() {
    let launch = launch(&spec(HarnessPreset::GeminiCli), &ctx(Path::new("/h"))).expect("launch");
    assert_eq!(launch.program, "gemini");
    assert_eq!(&launch.args[..2], ["-m", "policy"]);
    assert_eq!(env_of(&launch, "GEMINI_CLI_TRUST_WORKSPACE"), Some("true"));
    assert_eq!(
        env_of(&launch, "GOOGLE_GEMINI_BASE_URL"),
        Some("http://127.0.0.1:8370")
    );
    let settings = file_json(&launch, ".gemini/settings.json");
    assert_eq!(settings["privacy"]["usageStatisticsEnabled"], false);
    // No loop checks sent to a model of its own naming.
    assert_eq!(settings["model"]["disableLoopDetection"], true);
}

#[test]
fn presets_with_one_api_refuse_another() {
    for (preset, api) in [
        (HarnessPreset::Codex, ProviderApi::OpenaiChat),
        (HarnessPreset::ClaudeCode, ProviderApi::OpenaiChat),
        (HarnessPreset::GeminiCli, ProviderApi::Anthropic),
    ] {
        let mut s = spec(preset);
        s.api = Some(api);
        assert_eq!(
            launch(&s, &ctx(Path::new("/h"))).map(|_| ()),
            Err(PresetError::Api {
                preset: match preset {
                    HarnessPreset::Codex => "codex",
                    HarnessPreset::ClaudeCode => "claude-code",
                    _ => "gemini-cli",
                },
                api
            })
        );
    }
}

#[test]
fn custom_needs_a_command_and_user_env_and_args_come_last() {
    assert_eq!(
        launch(&spec(HarnessPreset::Custom), &ctx(Path::new("/h"))),
        Err(PresetError::NoCommand)
    );
    let mut s = spec(HarnessPreset::Custom);
    s.command = vec!["python3".into(), "agent.py".into()];
    s.args = vec!["--fast".into()];
    s.env = vec![
        EnvVar {
            name: "OPENAI_BASE_URL".into(),
            value: Some("http://override".into()),
            value_from: None,
        },
        EnvVar {
            name: "FROM_SECRET".into(),
            value: None,
            value_from: Some(Default::default()),
        },
    ];
    let launch = launch(&s, &ctx(Path::new("/h"))).expect("launch");
    assert_eq!(launch.program, "python3");
    assert_eq!(launch.args, ["agent.py", "--fast"]);
    assert_eq!(env_of(&launch, "OPENAI_BASE_URL"), Some("http://override"));
    assert_eq!(
        env_of(&launch, "FROM_SECRET"),
        None,
        "valueFrom is the kubelet's job"
    );
    assert_eq!(
        env_of(&launch, "FLOE_INSTRUCTION_FILE"),
        Some("/state/instruction.md")
    );
}

#[test]
fn settings_must_be_an_object_and_merge_deeply() {
    let mut s = spec(HarnessPreset::ClaudeCode);
    s.settings = Some(json!([1]));
    assert_eq!(
        launch(&s, &ctx(Path::new("/h"))),
        Err(PresetError::Settings)
    );
    let mut base = json!({"a": {"b": 1, "c": 2}, "d": 3});
    merge(&mut base, &json!({"a": {"b": 9}, "e": 4}));
    assert_eq!(base, json!({"a": {"b": 9, "c": 2}, "d": 3, "e": 4}));
}
