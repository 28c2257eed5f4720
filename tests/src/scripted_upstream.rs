//! The deterministic test upstream: an OpenAI-compatible server that answers like vLLM with
//! `return_token_ids` (prompt and sampled token ids, logprobs) but follows a script instead of
//! sampling — so a real, unmodified harness can be driven through a full agent loop (tool call
//! → tool result → next call) with a known outcome. It is the "model" in tests that check
//! what happens *around* the model: editing files, grading, shipping.
//!
//! Step N of the script answers the call whose conversation already holds N assistant turns.
//! A `Shell` step calls whichever shell tool the harness offers (`bash`, `Bash`, `shell`,
//! `exec_command`, `run_shell_command`, …) with arguments shaped by that tool's schema.
//! Tokens are bytes (id = byte + 3, end of turn = 2), so ids are exact and reproducible.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Clone, Debug)]
pub enum Step {
    /// Run this shell command through the harness's shell tool.
    Shell(String),
    /// Answer with text and stop.
    Say(String),
    /// Call the tool with this name (as the model is shown it) with these arguments.
    Call(String, Value),
}

pub struct ScriptedUpstream {
    pub url: String,
    calls: Arc<AtomicUsize>,
    requests: Arc<std::sync::Mutex<Vec<Value>>>,
}

impl ScriptedUpstream {
    pub async fn start(script: Vec<Step>) -> anyhow::Result<Self> {
        Self::start_on(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), script).await
    }

    /// Serve on `listen` (pods reach a server on the node's bridge address).
    pub async fn start_on(listen: std::net::SocketAddr, script: Vec<Step>) -> anyhow::Result<Self> {
        let calls = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let state = Arc::new((script, calls.clone(), requests.clone()));
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/tokenize", post(tokenize))
            .route(
                "/v1/models",
                get(|| async {
                    Json(json!({"object": "list", "data": [{"id": "policy", "object": "model"}]}))
                }),
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self {
            url,
            calls,
            requests,
        })
    }

    /// Every chat-completion request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The content of every tool message the model was sent, over all requests, in order.
    pub fn tool_results(&self) -> Vec<Value> {
        self.requests()
            .iter()
            .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].clone())
            .collect()
    }

    /// Chat completions answered so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

type Shared = Arc<(
    Vec<Step>,
    Arc<AtomicUsize>,
    Arc<std::sync::Mutex<Vec<Value>>>,
)>;

const END_OF_TURN: u32 = 2;

fn tokens(text: &str) -> Vec<u32> {
    text.bytes().map(|b| u32::from(b) + 3).collect()
}

/// A fixed chat template over the messages (and tools), as bytes; with thinking off
/// (`chat_template_kwargs.enable_thinking: false`), an empty think block opens the answer, as
/// Qwen3's template does.
fn render_call(body: &Value) -> String {
    let mut out = render(&body["messages"], &body["tools"]);
    if body["chat_template_kwargs"]["enable_thinking"] == json!(false) {
        out.push_str("<think></think>");
    }
    out
}

/// A fixed chat template over the messages (and tools), as bytes.
fn render(messages: &Value, tools: &Value) -> String {
    let mut out = String::new();
    if tools.is_array() {
        out.push_str(&format!("<tools>{tools}</tools>"));
    }
    for m in messages.as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or("user");
        let content = match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        out.push_str(&format!("<{role}>{content}"));
        if let Some(calls) = m["tool_calls"].as_array() {
            for c in calls {
                out.push_str(&c["function"].to_string());
            }
        }
        out.push_str("<end>");
    }
    out.push_str("<assistant>");
    out
}

async fn tokenize(Json(body): Json<Value>) -> Json<Value> {
    let text = match body.get("messages") {
        Some(_) => render_call(&body),
        None => body["prompt"].as_str().unwrap_or_default().to_string(),
    };
    let ids = tokens(&text);
    Json(json!({"count": ids.len(), "max_model_len": 1_000_000, "tokens": ids}))
}

const SHELL_TOOLS: &[&str] = &[
    "bash",
    "Bash",
    "shell",
    "exec_command",
    "shell_command",
    "run_shell_command",
    "local_shell",
];

/// The harness's shell tool and arguments for `command` shaped by its parameter schema.
fn shell_call(tools: &Value, command: &str) -> Option<(String, Value)> {
    let functions: Vec<&Value> = tools
        .as_array()?
        .iter()
        .map(|t| {
            if t["function"].is_object() {
                &t["function"]
            } else {
                t
            }
        })
        .collect();
    let tool = SHELL_TOOLS
        .iter()
        .find_map(|name| functions.iter().find(|f| f["name"] == *name))?;
    let props = &tool["parameters"]["properties"];
    let args = if props["command"]["type"] == "array" {
        json!({"command": ["bash", "-lc", command]})
    } else if props.get("cmd").is_some() {
        json!({"cmd": command})
    } else {
        let mut a = json!({"command": command});
        if props.get("description").is_some() {
            a["description"] = json!("run a command");
        }
        a
    };
    Some((tool["name"].as_str()?.to_string(), args))
}

/// The assistant message calling `name`, its finish reason and the text sampled for it.
fn tool_call(n: usize, name: &str, args: &Value) -> (Value, &'static str, String) {
    let call = json!({"id": format!("call_{n}"), "type": "function",
        "function": {"name": name, "arguments": args.to_string()}});
    let text = call["function"].to_string();
    (
        json!({"role": "assistant", "content": null, "tool_calls": [call]}),
        "tool_calls",
        text,
    )
}

async fn complete(State(state): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    let (script, calls, requests) = &*state;
    let n = calls.fetch_add(1, Ordering::SeqCst);
    if let Ok(mut r) = requests.lock() {
        r.push(body.clone());
    }
    let turn = body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
    let step = script
        .get(turn)
        .cloned()
        .unwrap_or_else(|| Step::Say("Done.".into()));
    let prompt_ids = tokens(&render_call(&body));
    let (message, finish, sampled_text) = match step {
        Step::Shell(command) => match shell_call(&body["tools"], &command) {
            Some((name, args)) => tool_call(n, &name, &args),
            None => {
                let text = "I have no shell tool.".to_string();
                (json!({"role": "assistant", "content": text}), "stop", text)
            }
        },
        Step::Say(text) => (json!({"role": "assistant", "content": text}), "stop", text),
        Step::Call(name, args) => tool_call(n, &name, &args),
    };
    let mut sampled = tokens(&sampled_text);
    sampled.push(END_OF_TURN);
    let logprobs: Vec<Value> = sampled
        .iter()
        .map(|t| json!({"token": format!("token_id:{t}"), "logprob": -0.125, "top_logprobs": []}))
        .collect();
    Json(json!({
        "id": format!("scripted-{n}"), "object": "chat.completion", "model": "policy",
        "created": 0,
        "prompt_token_ids": prompt_ids,
        "choices": [{"index": 0, "message": message, "finish_reason": finish,
            "token_ids": sampled, "logprobs": {"content": logprobs}}],
        "usage": {"prompt_tokens": prompt_ids.len(), "completion_tokens": sampled.len(),
            "total_tokens": prompt_ids.len() + sampled.len()},
    }))
}
