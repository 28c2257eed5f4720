//! A test double for an SGLang server, in front of a real vLLM: SGLang does not run on these
//! machines (no CPU build on PyPI), so this shim answers in SGLang 0.5's shape while a genuine
//! model does the tokenizing and sampling.
//!
//! It takes SGLang's capture switches (`return_prompt_token_ids`, `return_meta_info`) and refuses
//! a request without them (or with vLLM's `return_token_ids`, which SGLang would ignore), asks
//! vLLM with its own switch, and moves what vLLM returns to where SGLang puts it
//! (`python/sglang/srt/entrypoints/openai/protocol.py`, `ChatCompletionResponseChoice`): the
//! prompt ids into `choices[0].prompt_token_ids`, the sampled ids with their logprobs into
//! `choices[0].meta_info.output_token_logprobs` as `[logprob, token id, null]`, and a
//! `weight_version` in `meta_info`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

pub struct SglangShim {
    pub url: String,
}

/// The `meta_info.weight_version` the shim reports.
pub const SHIM_WEIGHT_VERSION: u64 = 3;

struct Shim {
    vllm: String,
    http: reqwest::Client,
}

impl SglangShim {
    pub async fn start(vllm_url: &str) -> anyhow::Result<Self> {
        let state = Arc::new(Shim {
            vllm: vllm_url.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { url })
    }
}

fn refuse(message: &str) -> (StatusCode, Json<Value>) {
    (
        StatusCode::BAD_REQUEST,
        Json(
            json!({"object": "error", "message": message, "type": "BadRequestError", "code": 400}),
        ),
    )
}

async fn complete(
    State(shim): State<Arc<Shim>>,
    Json(mut body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let on = |key: &str| body[key].as_bool() == Some(true);
    if !(on("return_prompt_token_ids") && on("return_meta_info") && on("logprobs")) {
        return refuse(
            "the SGLang shim needs return_prompt_token_ids, return_meta_info and logprobs",
        );
    }
    if body.get("return_token_ids").is_some() {
        return refuse("return_token_ids is vLLM's switch; SGLang 0.5 ignores it");
    }
    if let Some(obj) = body.as_object_mut() {
        obj.remove("return_prompt_token_ids");
        obj.remove("return_meta_info");
        obj.insert("return_token_ids".into(), true.into());
    }
    let answer = match shim
        .http
        .post(format!("{}/v1/chat/completions", shim.vllm))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_GATEWAY,
                Json(json!({"message": e.to_string()})),
            )
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut v: Value = answer.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        return (status, Json(v));
    }
    let id = v["id"].clone();
    let prompt = v
        .as_object_mut()
        .and_then(|o| o.remove("prompt_token_ids"))
        .unwrap_or(Value::Null);
    if let Some(choice) = v["choices"].get_mut(0).and_then(Value::as_object_mut) {
        let ids = choice.remove("token_ids").unwrap_or(Value::Null);
        let output: Vec<Value> = ids
            .as_array()
            .into_iter()
            .flatten()
            .zip(
                choice["logprobs"]["content"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            )
            .map(|(id, lp)| json!([lp["logprob"], id, null]))
            .collect();
        choice.insert("prompt_token_ids".into(), prompt);
        choice.insert(
            "meta_info".into(),
            json!({"id": id, "weight_version": SHIM_WEIGHT_VERSION.to_string(),
                   "output_token_logprobs": output}),
        );
        choice.insert("matched_stop".into(), Value::Null);
    }
    (status, Json(v))
}
