//! The gateway's answers to bad input and a dead upstream, in each caller's own error shape
//! (no model server needed: the upstream is a closed port), and a train job's sampling
//! contract as a scripted model server receives it.

use anyhow::{Context, Result};
use floe_gateway::capture::read_session;
use floe_tests::{ScriptedUpstream, Step, TestGateway};
use serde_json::{json, Value};

async fn dead_upstream_gateway() -> Result<TestGateway> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port(); // closed once dropped
                 // A dead upstream is retried until the call's deadline: keep it short here.
    TestGateway::start_with_deadline(
        &format!("http://127.0.0.1:{port}"),
        16,
        Default::default(),
        std::time::Duration::from_secs(2),
    )
    .await
}

async fn call(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    body: Vec<u8>,
) -> Result<(u16, Value)> {
    let resp = http
        .post(url)
        .header("x-api-key", token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

/// `n` [`call`]s of `body` to `url` at once, each in a task of its own.
fn in_background(
    n: usize,
    http: &reqwest::Client,
    url: &str,
    token: &str,
    body: &str,
) -> Vec<tokio::task::JoinHandle<Result<(u16, Value)>>> {
    (0..n)
        .map(|_| {
            let (http, url, token, body) = (
                http.clone(),
                url.to_string(),
                token.to_string(),
                body.to_string(),
            );
            tokio::spawn(async move { call(&http, &url, &token, body.into_bytes()).await })
        })
        .collect()
}

/// [`call`] with a JSON body, to `path` of the gateway at `base`.
async fn call_json(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    token: &str,
    body: &Value,
) -> Result<(u16, Value)> {
    call(
        http,
        &format!("{base}{path}"),
        token,
        serde_json::to_vec(body)?,
    )
    .await
}

#[tokio::test]
async fn every_api_answers_errors_in_its_own_shape() -> Result<()> {
    let gw = dead_upstream_gateway().await?;
    let http = reqwest::Client::new();
    let token = gw.session("errors-1", "t", 0).await?;
    let chat = format!("{}/v1/chat/completions", gw.url);
    let messages = format!("{}/v1/messages", gw.url);
    let responses = format!("{}/v1/responses", gw.url);

    // Unknown token: 401, never an implicit session.
    let (s, b) = call(&http, &chat, "floe-nope", b"{}".to_vec()).await?;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (s, b) = call(&http, &messages, "floe-nope", b"{}".to_vec()).await?;
    assert_eq!(
        (s, b["type"].as_str(), b["error"]["type"].as_str()),
        (401, Some("error"), Some("authentication_error"))
    );
    let (s, b) = call(&http, &responses, "floe-nope", b"{}".to_vec()).await?;
    assert_eq!(
        (s, b["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );

    // Malformed bodies: 400 naming the problem.
    let (s, b) = call(&http, &chat, &token, b"{not json".to_vec()).await?;
    assert_eq!(s, 400);
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not JSON"),
        "{b}"
    );
    let (s, b) = call(
        &http,
        &messages,
        &token,
        json!({"messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes(),
    )
    .await?;
    assert_eq!(
        (s, b["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("max_tokens"),
        "{b}"
    );

    // A body of tiny values (a gigabyte once parsed) is refused before it is parsed.
    let mut tiny = br#"{"messages": [], "metadata": {"pad": ["#.to_vec();
    tiny.extend(b"0,".repeat(1_000_000));
    tiny.extend(b"0]}}");
    let (s, b) = call(&http, &chat, &token, tiny).await?;
    assert_eq!(s, 400, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("JSON values"),
        "{b}"
    );

    // Oversized: 413 in shape, before the body is read.
    let big = format!(
        r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "x".repeat(5 * 1024 * 1024)
    );
    let (s, b) = call(&http, &chat, &token, big.into_bytes()).await?;
    assert_eq!(s, 413);
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("exceeds the limit"),
        "{b}"
    );

    // Dead upstream: 502 in shape; nothing was sampled, so nothing is captured.
    let ok_body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes();
    let (s, b) = call(&http, &chat, &token, ok_body).await?;
    assert_eq!(
        (s, b["error"]["type"].as_str()),
        (502, Some("server_error"))
    );
    let (s, b) = call(
        &http,
        &messages,
        &token,
        json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes(),
    )
    .await?;
    assert_eq!((s, b["error"]["type"].as_str()), (502, Some("api_error")));
    // Streamed, the Responses API's failure is a typed event Codex acts on (a bare `error`
    // object it dropped as unparsable, and read the stream as cut).
    let sse = http
        .post(&responses)
        .bearer_auth(&token)
        .json(&json!({"model": "m", "input": "hi", "stream": true}))
        .send()
        .await?
        .text()
        .await?;
    let failed: Value = sse
        .lines()
        .skip_while(|l| *l != "event: response.failed")
        .find_map(|l| l.strip_prefix("data: "))
        .map(serde_json::from_str)
        .transpose()?
        .unwrap_or_default();
    assert_eq!(
        (
            failed["type"].as_str(),
            failed["response"]["status"].as_str(),
            failed["response"]["error"]["code"].as_str()
        ),
        (
            Some("response.failed"),
            Some("failed"),
            Some("server_error")
        ),
        "{sse}"
    );

    // Unknown paths: 404 in the shape the path belongs to.
    let (s, b) = call(
        &http,
        &format!("{}/v1beta/models/gemini-2.5-pro:embedContent", gw.url),
        &token,
        b"{}".to_vec(),
    )
    .await?;
    assert_eq!((s, b["error"]["status"].as_str()), (404, Some("NOT_FOUND")));

    // The connectivity probe answers without a session.
    assert_eq!(
        http.get(format!("{}/api/hello", gw.url))
            .send()
            .await?
            .status(),
        200
    );
    assert_eq!(
        http.head(format!("{}/api/hello", gw.url))
            .send()
            .await?
            .status(),
        200
    );
    // Counting tokens needs a session too, and reports a dead upstream in shape.
    let (s, b) = call(
        &http,
        &format!("{}/v1/messages/count_tokens", gw.url),
        "floe-nope",
        b"{}".to_vec(),
    )
    .await?;
    assert_eq!(
        (s, b["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );
    let count_body = json!({"messages": [{"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes();
    let (s, _) = call(
        &http,
        &format!("{}/v1/messages/count_tokens", gw.url),
        &token,
        count_body,
    )
    .await?;
    assert_eq!(s, 502);

    gw.close("errors-1").await?;
    assert!(read_session(&gw.session_dir("errors-1"))?
        .records
        .is_empty());
    let metrics = gw.gateway.metrics.render();
    for needle in [
        r#"kind="unauthorized"} 4"#,
        r#"kind="too_large"} 1"#,
        r#"kind="upstream"} 4"#,
        r#"kind="invalid_request"} 3"#,
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
    Ok(())
}

#[tokio::test]
async fn the_control_api_guards_sessions() -> Result<()> {
    let gw = dead_upstream_gateway().await?;
    let http = reqwest::Client::new();
    let sessions = format!("{}/floe/v1/sessions", gw.url);
    let no_auth = http
        .post(&sessions)
        .json(&json!({"session": "a"}))
        .send()
        .await?;
    assert_eq!(no_auth.status(), 401);
    let wrong = http
        .post(&sessions)
        .bearer_auth("guess")
        .json(&json!({"session": "a"}))
        .send()
        .await?;
    assert_eq!(wrong.status(), 401);
    let bad_id = http
        .post(&sessions)
        .bearer_auth(&gw.control_token)
        .json(&json!({"session": "../etc"}))
        .send()
        .await?;
    assert_eq!(bad_id.status(), 400);
    // Creation is idempotent by session id: a retried assignment gets the same token.
    let first = gw.session("s-1", "t", 3).await?;
    let again = gw.session("s-1", "t", 3).await?;
    assert_eq!(first, again);
    let info: Value = http
        .get(format!("{sessions}/s-1"))
        .bearer_auth(&gw.control_token)
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(
        (
            info["sample"].as_u64(),
            info["open"].as_bool(),
            info["calls"].as_u64()
        ),
        (Some(3), Some(true), Some(0))
    );
    let deleted = http
        .delete(format!("{sessions}/s-1"))
        .bearer_auth(&gw.control_token)
        .send()
        .await?;
    assert_eq!(deleted.status(), 200);
    let gone = http
        .get(format!("{sessions}/s-1"))
        .bearer_auth(&gw.control_token)
        .send()
        .await?;
    assert_eq!(gone.status(), 404);
    // The deleted session's token no longer works, and its capture is sealed on disk.
    let (s, _) = call(
        &http,
        &format!("{}/v1/chat/completions", gw.url),
        &first,
        b"{}".to_vec(),
    )
    .await?;
    assert_eq!(s, 401);
    assert!(read_session(&gw.session_dir("s-1"))?.sealed);
    Ok(())
}

/// A train job's calls, through three provider APIs, with the parameters an agent once got
/// through to the model server: upstream they carry the policy's own sampling set and none of
/// the caller's (nor a strict tool's grammar); the capture and the gateway's metrics name what was dropped. With
/// `callerParams: Refuse` such a call gets a 400 in its own API's shape, naming them; an sft
/// session passes them through.
#[tokio::test]
async fn a_train_job_samples_only_the_policy_s_distribution() -> Result<()> {
    let model = ScriptedUpstream::start(vec![Step::Say("ok".into())]).await?;
    let gw = TestGateway::start(&model.url, 64).await?;
    let http = reqwest::Client::new();
    let train = json!({"temperature": 0.7, "topP": 1.0, "callerSampling": "drop"});
    let token = gw
        .session_with("contract-drop", "t", 0, train.clone())
        .await?;
    let calls = [
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "logit_bias": {"42": 100}, "ignore_eos": true, "min_tokens": 20, "top_k": 3,
                "repetition_penalty": 1.4, "guided_regex": "a+", "temperature": 0.0,
                "seed": 7}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 16, "top_k": 5, "temperature": 0.1,
                // vLLM would cut the answer's tool calls to one after sampling.
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
                // vLLM would decode under the tool's grammar.
                "tools": [{"name": "edit", "strict": true, "input_schema": {"type": "object",
                    "properties": {"path": {"type": "string"}}}}],
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                        "data": "iVBORw0KGgo="}}]}]}),
        ),
        (
            "/v1beta/models/m:generateContent",
            json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                "generationConfig": {"topK": 7, "temperature": 0.2, "seed": 7,
                    "responseMimeType": "application/json"}}),
        ),
    ];
    for (path, body) in &calls {
        let (status, answer) = call_json(&http, &gw.url, path, &token, body).await?;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    for r in &requests {
        assert_eq!(
            (
                &r["temperature"],
                &r["top_p"],
                &r["top_k"],
                &r["min_p"],
                &r["repetition_penalty"],
                &r["presence_penalty"],
                &r["frequency_penalty"]
            ),
            (
                &json!(0.7),
                &json!(1.0),
                &json!(-1),
                &json!(0.0),
                &json!(1.0),
                &json!(0.0),
                &json!(0.0)
            ),
            "{r}"
        );
        for foreign in [
            "logit_bias",
            "ignore_eos",
            "min_tokens",
            "guided_regex",
            "response_format",
            // Each sample alone is the policy's, but a pinned seed makes a group's alike.
            "seed",
            "parallel_tool_calls",
        ] {
            assert!(
                r.get(foreign).is_none(),
                "{foreign} reached the server: {r}"
            );
        }
    }
    let tools = &requests[1]["tools"];
    assert!(
        tools[0]["function"]["name"] == "edit" && tools[0]["function"].get("strict").is_none(),
        "{tools}"
    );
    // The trainer takes text only: the image reached the server as a note, no media part.
    let sent = requests[1]["messages"].to_string();
    assert!(
        sent.contains("media omitted") && !sent.contains("image_url"),
        "{sent}"
    );
    gw.close("contract-drop").await?;
    let capture = read_session(&gw.session_dir("contract-drop"))?;
    let dropped: Vec<&str> = capture
        .records
        .iter()
        .flat_map(|r| r.dropped.iter().map(String::as_str))
        .collect();
    for name in [
        "sampling:logit_bias",
        "sampling:top_k",
        "sampling:response_format",
        "sampling:seed",
        "sampling:image_url",
        "sampling:parallel_tool_calls",
        "sampling:strict",
    ] {
        assert!(dropped.contains(&name), "{name} in {dropped:?}");
    }
    let page = metrics_page(&http, &gw).await?;
    assert!(
        page.lines()
            .any(|l| l.starts_with("floe_gateway_dropped_total")
                && l.contains("what=\"sampling:ignore_eos\"")),
        "{page}"
    );

    // Refuse: the caller's own 400, naming what it sent; nothing reaches the server.
    let mut refuse = train.clone();
    refuse["callerSampling"] = json!("refuse");
    let token = gw.session_with("contract-refuse", "t", 0, refuse).await?;
    let (status, answer) = call(
        &http,
        &format!("{}/v1/messages", gw.url),
        &token,
        serde_json::to_vec(&calls[1].1)?,
    )
    .await?;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["type"], "error", "Anthropic's shape: {answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("top_k") && message.contains("media (image_url)"),
        "{answer}"
    );
    assert_eq!(model.requests().len(), 3, "nothing more reached the server");

    // sft: the caller's parameters pass; temperature is still the job's, and no call asks
    // vLLM to cut its tool calls after sampling (the dataset would keep the cut ones).
    let token = gw
        .session_with("contract-sft", "t", 0, json!({"temperature": 0.9}))
        .await?;
    let mut sft_call = calls[0].1.clone();
    // `0` is `false` to vLLM's request model.
    sft_call["parallel_tool_calls"] = json!(0);
    let (status, _) = call_json(&http, &gw.url, "/v1/chat/completions", &token, &sft_call).await?;
    assert_eq!(status, 200);
    let last = model.requests().pop().unwrap_or_default();
    assert_eq!(
        (&last["top_k"], &last["temperature"]),
        (&json!(3), &json!(0.9))
    );
    assert_eq!(last["logit_bias"], json!({"42": 100}));
    assert!(last.get("parallel_tool_calls").is_none(), "{last}");
    Ok(())
}

/// A token count goes the way its call would: in a train job an image counts as the note it
/// becomes there, however large; in an sft job as itself; a remote URL is refused in both.
#[tokio::test]
async fn a_token_count_counts_what_the_call_would_send() -> Result<()> {
    let model = ScriptedUpstream::start(vec![Step::Say("ok".into())]).await?;
    let gw = TestGateway::start(&model.url, 64).await?;
    let http = reqwest::Client::new();
    let image = |data: String| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data}}]}]})
    };
    let (small, large) = (image("AAAA".into()), image("A".repeat(4000)));
    let path = "/v1/messages/count_tokens";
    let train = gw
        .session_with(
            "count-train",
            "t",
            0,
            json!({"temperature": 1.0, "topP": 1.0, "callerSampling": "drop"}),
        )
        .await?;
    let sft = gw.session_with("count-sft", "t", 0, json!({})).await?;
    let mut counts = Vec::new();
    for token in [&train, &sft] {
        for body in [&small, &large] {
            let (status, answer) = call_json(&http, &gw.url, path, token, body).await?;
            assert_eq!(status, 200, "{answer}");
            counts.push(answer["input_tokens"].as_u64().unwrap_or_default());
        }
    }
    assert_eq!(
        counts[0], counts[1],
        "a train job counts the note: {counts:?}"
    );
    assert!(
        counts[3] > counts[2],
        "an sft job counts the image: {counts:?}"
    );
    // Rendered with the call's template switches: thinking off (Qwen3's empty think block)
    // counts what the call's prompt holds.
    let no_thinking = json!({"model": "m", "max_tokens": 8, "thinking": {"type": "disabled"},
                             "messages": [{"role": "user", "content": "hi"}]});
    let mut count_body = no_thinking.clone();
    count_body.as_object_mut().map(|m| m.remove("max_tokens"));
    let (status, counted) = call_json(&http, &gw.url, path, &sft, &count_body).await?;
    assert_eq!(status, 200, "{counted}");
    let (status, answered) = call_json(&http, &gw.url, "/v1/messages", &sft, &no_thinking).await?;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(
        counted["input_tokens"], answered["usage"]["input_tokens"],
        "{counted} {answered}"
    );
    let remote = json!({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/x.png?k=secret"}}]}]});
    for token in [&train, &sft] {
        let (status, answer) = call_json(&http, &gw.url, path, token, &remote).await?;
        assert_eq!(
            (status, answer["type"].as_str()),
            (400, Some("error")),
            "{answer}"
        );
    }
    Ok(())
}

/// Media named by a remote URL would have the model server fetch it for the agent, past its
/// sandbox's network: refused in each API's own shape, and nothing reaches the server; the same
/// image inline goes through.
#[tokio::test]
async fn media_by_remote_url_is_refused_in_each_apis_shape_and_inline_media_passes() -> Result<()> {
    let model = ScriptedUpstream::start(vec![Step::Say("ok".into())]).await?;
    let gw = TestGateway::start(&model.url, 64).await?;
    let http = reqwest::Client::new();
    let token = gw.session("media", "t", 0).await?;
    let leak = "http://127.0.0.1:9/x.png?stolen=secret";
    let calls = [
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": leak}}]}]}),
            "invalid_request_error",
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": leak}},
                {"type": "text", "text": "look"}]}]}),
            "invalid_request_error",
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": leak}]}]}),
            "invalid_request_error",
        ),
    ];
    for (path, body, kind) in &calls {
        let (status, answer) = call_json(&http, &gw.url, path, &token, body).await?;
        assert_eq!(status, 400, "{path}: {answer}");
        assert_eq!(
            answer["error"]["type"].as_str(),
            Some(*kind),
            "{path}: {answer}"
        );
        let said = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(said.contains("media must be inline"), "{path}: {said}");
    }
    assert_eq!(
        model.requests().len(),
        0,
        "nothing reached the model server"
    );
    let inline = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    let (status, answer) =
        call_json(&http, &gw.url, "/v1/chat/completions", &token, &inline).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(model.requests().len(), 1);
    Ok(())
}

/// A session's calls in flight are bounded: past the bound a call is answered 429 in its API's
/// shape at once (an agent opening hundreds would run the gateway out of memory), and places
/// come back as calls end.
#[tokio::test]
async fn a_sessions_calls_in_flight_are_bounded_with_a_429_in_shape() -> Result<()> {
    // A model server that takes connections and never answers: every call waits for its
    // deadline.
    let hung = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", hung.local_addr()?);
    let gw = TestGateway::start_with_deadline(
        &url,
        64,
        Default::default(),
        std::time::Duration::from_secs(4),
    )
    .await?;
    let http = reqwest::Client::new();
    let token = gw.session("flood", "t", 0).await?;
    let chat = format!("{}/v1/chat/completions", gw.url);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let waiting = in_background(16, &http, &chat, &token, &body);
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let (status, answer) = call(&http, &chat, &token, body.clone().into_bytes()).await?;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "rate_limit_exceeded", "{answer}");
    let messages = format!("{}/v1/messages", gw.url);
    let anthropic = json!({"model": "m", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "hi"}]});
    let (status, answer) =
        call(&http, &messages, &token, anthropic.to_string().into_bytes()).await?;
    assert_eq!(
        (status, &answer["error"]["type"]),
        (429, &json!("rate_limit_error")),
        "{answer}"
    );
    for w in waiting {
        let (status, _) = w.await??;
        assert_eq!(status, 504, "the hung calls end at their deadline");
    }
    // Their places are back: the next call is taken (and waits for the model, not refused).
    let (status, _) = call(&http, &chat, &token, body.into_bytes()).await?;
    assert_eq!(status, 504);

    // Bytes too: the bodies in flight stay within twice the body limit (4 MiB here: 8 MiB), each
    // held several times over while its call runs. Two calls of 3 MiB wait; a third is a 429,
    // and a small one still fits.
    let token = gw.session("heavy", "t", 0).await?;
    let heavy =
        json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(3 << 20)}]})
            .to_string();
    let waiting = in_background(2, &http, &chat, &token, &heavy);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (status, answer) = call(&http, &chat, &token, heavy.clone().into_bytes()).await?;
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bytes of request bodies")),
        "{answer}"
    );
    let small = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _) = call(&http, &chat, &token, small.to_string().into_bytes()).await?;
    assert_eq!(
        status, 504,
        "a small call fits beside them and waits for the model"
    );
    for w in waiting {
        let (status, _) = w.await??;
        assert_eq!(status, 504);
    }
    let (status, _) = call(&http, &chat, &token, heavy.into_bytes()).await?;
    assert_eq!(status, 504, "their bytes are back");
    drop(hung);
    Ok(())
}

/// A body sent chunked (no `Content-Length`) is charged to its session's bytes in flight as
/// it arrives (for the memory it takes, which grows by doubling up to the 4 MiB limit): two
/// unfinished 3 MiB bodies take the 8 MiB, and a third is a 429 in shape while still being
/// sent (charged only once whole, each of sixteen could hold up to the limit, and the third
/// would wait for its end).
#[tokio::test]
async fn a_chunked_body_is_charged_as_it_arrives() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hung = std::net::TcpListener::bind("127.0.0.1:0")?;
    let gw = TestGateway::start_with_deadline(
        &format!("http://{}", hung.local_addr()?),
        64,
        Default::default(),
        std::time::Duration::from_secs(30),
    )
    .await?;
    let token = gw.session("chunked", "t", 0).await?;
    let addr = gw.url.trim_start_matches("http://").to_owned();
    // A chat call's head, then 3 MiB of its body in chunks, never finished.
    let unfinished = || {
        let (addr, token) = (addr.clone(), token.clone());
        async move {
            let mut c = tokio::net::TcpStream::connect(&addr).await?;
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            );
            c.write_all(head.as_bytes()).await?;
            // A refused body's rest may meet a closed connection: its answer is read after.
            let piece = [
                format!("{:x}\r\n", 256 << 10).into_bytes(),
                vec![b' '; 256 << 10],
                b"\r\n".to_vec(),
            ]
            .concat();
            for _ in 0..12 {
                if c.write_all(&piece).await.is_err() {
                    break;
                }
            }
            anyhow::Ok(c)
        }
    };
    // Which of the three crosses the bytes in flight depends on the order the gateway reads
    // them in: one does, and is answered while the others still wait for their bodies.
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..3 {
        let mut c = unfinished().await?;
        reads.spawn(async move {
            // An answer's head and its JSON, without waiting for a close.
            let mut answer = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&answer).contains("bytes of request bodies") {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
            }
            (i, String::from_utf8_lossy(&answer).into_owned(), c)
        });
    }
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), reads.join_next()).await;
    let Ok(Some(Ok((i, answer, _refused)))) = first else {
        anyhow::bail!("no unfinished chunked body was refused as it came: {first:?}");
    };
    assert!(
        answer.starts_with("HTTP/1.1 429") && answer.contains("rate_limit_exceeded"),
        "body {i} was answered, but not with a 429 in shape: {answer:?}"
    );
    let next = tokio::time::timeout(std::time::Duration::from_millis(500), reads.join_next()).await;
    assert!(
        next.is_err(),
        "a second body was answered: only one crossed the bytes in flight: {next:?}"
    );
    reads.abort_all();
    drop(hung);
    Ok(())
}

/// A session's budget (`sampling.maxCallsPerSession`, `maxSessionTokens`): past it, a call is
/// refused with a 400 in its API's shape that names the budget (not a context-length error,
/// which harnesses answer by compacting and calling again), and nothing reaches the server.
/// The agent's doing: its session is graded as it stands, never retried as infrastructure.
#[tokio::test]
async fn a_session_past_its_budget_is_refused_in_each_apis_shape() -> Result<()> {
    let model = ScriptedUpstream::start(vec![Step::Say("ok".into())]).await?;
    let gw = TestGateway::start(&model.url, 64).await?;
    let http = reqwest::Client::new();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let token = gw
        .session_with("two-calls", "t", 0, json!({"sessionBudget": {"calls": 2}}))
        .await?;
    for _ in 0..2 {
        let (status, answer) =
            call_json(&http, &gw.url, "/v1/chat/completions", &token, &chat).await?;
        assert_eq!(status, 200, "{answer}");
    }
    let refused = [
        ("/v1/chat/completions", chat.clone()),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1beta/models/m:generateContent",
            json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
        ),
    ];
    let mut shapes = Vec::new();
    for (path, body) in &refused {
        let (status, answer) = call_json(&http, &gw.url, path, &token, body).await?;
        assert_eq!(status, 400, "{path}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("budget of 2 model calls"),
            "{path}: {answer}"
        );
        shapes.push(match *path {
            "/v1/chat/completions" => answer["error"]["code"].clone(),
            "/v1/messages" => answer["error"]["type"].clone(),
            _ => answer["error"]["status"].clone(),
        });
    }
    assert_eq!(
        shapes,
        [
            json!("session_budget_exceeded"),
            json!("invalid_request_error"),
            json!("INVALID_ARGUMENT")
        ]
    );
    assert_eq!(model.requests().len(), 2, "nothing more reached the server");

    // Tokens: the first call spends the whole budget of one token; the next is refused.
    let token = gw
        .session_with("one-token", "t", 0, json!({"sessionBudget": {"tokens": 1}}))
        .await?;
    let (status, _) = call_json(&http, &gw.url, "/v1/chat/completions", &token, &chat).await?;
    assert_eq!(status, 200);
    let refused = call_json(&http, &gw.url, "/v1/chat/completions", &token, &chat).await?;
    past_the_budget(refused, "budget of 1 captured tokens");
    gw.close("one-token").await?;
    assert_eq!(read_session(&gw.session_dir("one-token"))?.records.len(), 1);

    // Bytes: what the capture holds, however little of it became tokens. A `metadata` the
    // gateway drops before the model (no token) is captured as sent: two calls padded with
    // 600 kB each fill a budget of 1 MB, and the third is refused.
    let token = gw
        .session_with(
            "one-mb",
            "t",
            0,
            json!({"sessionBudget": {"bytes": 1_000_000}}),
        )
        .await?;
    let mut padded = chat.clone();
    padded["metadata"] = json!({"pad": "x".repeat(600_000)});
    for _ in 0..2 {
        let (status, answer) =
            call_json(&http, &gw.url, "/v1/chat/completions", &token, &padded).await?;
        assert_eq!(status, 200, "{answer}");
    }
    let refused = call_json(&http, &gw.url, "/v1/chat/completions", &token, &chat).await?;
    past_the_budget(refused, "budget of 1000000 captured bytes");
    gw.close("one-mb").await?;
    assert_eq!(read_session(&gw.session_dir("one-mb"))?.records.len(), 2);
    let page = metrics_page(&http, &gw).await?;
    assert!(
        page.lines()
            .any(|l| l.starts_with("floe_gateway_errors_total")
                && l.contains("kind=\"session_budget\"")
                && !l.ends_with(" 0")),
        "{page}"
    );
    Ok(())
}

/// A call refused as past the session's budget, its message naming `which`.
fn past_the_budget((status, answer): (u16, Value), which: &str) {
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(which)),
        "{answer}"
    );
}

/// A caller that leaves before its answer comes (a harness's stream guard gave up, or it
/// exited): the call still finishes and is captured, marked `abandoned`, so the trajectory
/// leaves out a reply nobody acted on; one that stays is not marked. Both a plain call and a
/// stream whose caller leaves between keep-alives (nothing written yet to find it gone).
#[tokio::test]
async fn a_reply_the_caller_left_before_is_captured_as_abandoned() -> Result<()> {
    use floe_tests::{Fault, FaultProxy};
    use std::time::Duration;
    let upstream = ScriptedUpstream::start(vec![
        Step::Say("one".into()),
        Step::Say("two".into()),
        Step::Say("three".into()),
    ])
    .await?;
    let proxy = FaultProxy::start(&upstream.url).await?;
    proxy.set(Fault::Hang(Duration::from_millis(700)));
    // Keep-alives every second: the answers come before the first one is written.
    let gw = TestGateway::start(&proxy.url, 16).await?;
    let token = gw.session("left", "t", 0).await?;
    let http = reqwest::Client::new();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let plain = http
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(&token)
        .timeout(Duration::from_millis(200))
        .json(&chat)
        .send()
        .await;
    assert!(plain.is_err(), "the caller gave up: {plain:?}");
    let messages = json!({"model": "m", "max_tokens": 16, "stream": true,
                          "messages": [{"role": "user", "content": "hi"}]});
    let stream = http
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", &token)
        .json(&messages)
        .send()
        .await?;
    assert_eq!(stream.status(), 200, "the stream's headers go out at once");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.set(Fault::None);
    let (status, answer) = call_json(&http, &gw.url, "/v1/chat/completions", &token, &chat).await?;
    assert_eq!(status, 200, "{answer}");
    let records = read_session(&gw.session_dir("left"))?.records;
    let marks: Vec<(u64, bool)> = records.iter().map(|r| (r.seq, r.abandoned)).collect();
    assert_eq!(
        marks,
        [(0, true), (1, true), (2, false)],
        "each call captured"
    );
    let metrics = metrics_page(&http, &gw).await?;
    for api in ["openai_chat", "anthropic"] {
        let line = format!("floe_gateway_requests_total{{api=\"{api}\",status=\"abandoned\"}} 1");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    Ok(())
}

/// The gateway's Prometheus page.
async fn metrics_page(http: &reqwest::Client, gw: &TestGateway) -> Result<String> {
    Ok(http
        .get(format!("{}/metrics", gw.url))
        .send()
        .await?
        .text()
        .await?)
}

/// The session's result, as its runner posts it: completed, reward 1. Its summary.
async fn passed(http: &reqwest::Client, gw: &TestGateway, session: &str) -> Result<Value> {
    Ok(http
        .post(format!("{}/floe/v1/sessions/{session}/result", gw.url))
        .bearer_auth(&gw.control_token)
        .json(&json!({"status": "completed", "evaluation": {"reward": 1.0}}))
        .send()
        .await?
        .json()
        .await?)
}

/// The calls a trajectory's traces train, by their capture `seq`.
fn trained_calls(trajectory: &Value) -> Vec<u64> {
    trajectory["traces"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|tr| tr["completions"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_u64())
        .collect()
}

/// A train job's reply waits for the session's snapshot to reach the trainer. A caller that
/// gives up in that window never saw the reply its record (written before the snapshot) says
/// was answered: the call is noted beside the capture, read back as abandoned, counted, and
/// left out of the trajectory the trainer gets.
#[tokio::test]
async fn a_caller_that_leaves_while_its_snapshot_is_posted_is_noted_as_abandoned() -> Result<()> {
    use std::time::Duration;
    let steps = (0..2).map(|i| Step::Say(format!("answer {i}"))).collect();
    let model = ScriptedUpstream::start(steps).await?;
    let gw = TestGateway::start(&model.url, 16).await?;
    let trainer = floe_tests::TestIngest::start().await?;
    trainer.set_partial_delay(Duration::from_millis(1500));
    let assignment = json!({"session": "left-late", "task": "t", "group": "j/t", "sample": 0,
        "builder": "per_request", "sink": {"kind": "trainer", "url": trainer.url, "snapshots": true},
        "run": {}});
    let next = gw.assign_and_take(&assignment).await?;
    let token = next["token"].as_str().context("the session's token")?;
    let http = reqwest::Client::new();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, answer) = call_json(&http, &gw.url, "/v1/chat/completions", token, &chat).await?;
    assert_eq!(status, 200, "{answer}");
    let gave_up = http
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(token)
        .timeout(Duration::from_millis(500))
        .json(&chat)
        .send()
        .await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    // The harness exited: its session ends while that call's snapshot is still on its way
    // (it carries the call: the caller was there at capture). Noted only once the post was
    // done, the note came after the close, and the call trained as answered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let summary = passed(&http, &gw, "left-late").await?;
    assert_eq!(summary["abandonedCalls"], 1, "{summary}");
    let records = read_session(&gw.session_dir("left-late"))?.records;
    let marks: Vec<(u64, bool)> = records.iter().map(|r| (r.seq, r.abandoned)).collect();
    assert_eq!(marks, [(0, false), (1, true)]);
    let shipped = floe_tests::operator::eventually_every(
        Duration::from_millis(50),
        100,
        "the trajectory at the trainer",
        async || {
            Ok(trainer
                .accepted()
                .get("left-late")
                .and_then(|t| t.first().cloned()))
        },
    )
    .await?;
    let trained = trained_calls(&shipped);
    assert_eq!(trained, [0], "{}", shipped["stats"]);
    assert_eq!(
        shipped["stats"]["abandoned_calls"], 1,
        "{}",
        shipped["stats"]
    );
    let metrics = metrics_page(&http, &gw).await?;
    let line = "floe_gateway_requests_total{api=\"openai_chat\",status=\"abandoned\"} 1";
    assert!(metrics.contains(line), "{line} in\n{metrics}");
    Ok(())
}

/// Claude Code's request-class header is kept on each call's capture record; the agent can
/// send any header, so only a short lowercase word is kept (it keys a count in every
/// trajectory), and anything else is left out, the call itself answered.
#[tokio::test]
async fn a_calls_request_class_is_captured_and_a_forged_one_left_out() -> Result<()> {
    let steps = (0..5).map(|i| Step::Say(format!("answer {i}"))).collect();
    let model = ScriptedUpstream::start(steps).await?;
    let gw = TestGateway::start(&model.url, 16).await?;
    let token = gw.session("classes", "t", 0).await?;
    let http = reqwest::Client::new();
    let body =
        json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let long = "x".repeat(33);
    for class in [
        Some("main"),
        Some("compaction"),
        Some("Main Loop"),
        Some(long.as_str()),
        None,
    ] {
        let mut post = http
            .post(format!("{}/v1/messages", gw.url))
            .header("x-api-key", &token)
            .json(&body);
        if let Some(class) = class {
            post = post.header(floe_gateway::server::REQUEST_CLASS_HEADER, class);
        }
        let answer = post.send().await?;
        assert_eq!(answer.status(), 200, "{class:?}: {}", answer.text().await?);
    }
    gw.close("classes").await?;
    let records = read_session(&gw.session_dir("classes"))?.records;
    let classes: Vec<Option<&str>> = records.iter().map(|r| r.request_class.as_deref()).collect();
    assert_eq!(
        classes,
        [Some("main"), Some("compaction"), None, None, None]
    );
    Ok(())
}

/// A job's `trajectory.excludeRequestClasses` reaches the gateway in its sessions'
/// assignments: a call of an excluded class is answered and captured like any other, and the
/// session's trajectory trains none of its tokens (counted as excluded); the rest are trained.
#[tokio::test]
async fn calls_of_a_class_the_job_excludes_are_answered_captured_and_not_trained() -> Result<()> {
    let steps = (0..4).map(|i| Step::Say(format!("answer {i}"))).collect();
    let model = ScriptedUpstream::start(steps).await?;
    let gw = TestGateway::start(&model.url, 16).await?;
    let dataset = tempfile::tempdir()?;
    let http = reqwest::Client::new();
    let assignment = json!({"session": "excl-1", "task": "t", "group": "j/t", "sample": 0,
        "excludeClasses": ["auxiliary"], "builder": "per_request",
        "sink": {"kind": "dataset", "dir": dataset.path()}, "run": {}});
    let next = gw.assign_and_take(&assignment).await?;
    let token = next["token"].as_str().context("the session's token")?;
    let body =
        json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    for class in [Some("main"), Some("auxiliary"), None] {
        let mut post = http
            .post(format!("{}/v1/messages", gw.url))
            .header("x-api-key", token)
            .json(&body);
        if let Some(class) = class {
            post = post.header(floe_gateway::server::REQUEST_CLASS_HEADER, class);
        }
        let answer = post.send().await?;
        assert_eq!(answer.status(), 200, "{class:?}: {}", answer.text().await?);
    }
    let summary = passed(&http, &gw, "excl-1").await?;
    let records = read_session(&gw.session_dir("excl-1"))?.records;
    assert_eq!(records.len(), 3, "every call is captured");
    // Shipping follows the close.
    let written = || {
        ["accepted", "rejected"]
            .iter()
            .find_map(|d| std::fs::read(dataset.path().join(d).join("excl-1.json")).ok())
    };
    let shipped = floe_tests::operator::eventually_every(
        std::time::Duration::from_millis(50),
        20,
        "the trajectory in the dataset",
        async || Ok(written()),
    )
    .await?;
    let t: Value = serde_json::from_slice(&shipped)?;
    let trained = trained_calls(&t);
    let auxiliary = records
        .iter()
        .find(|r| r.request_class.as_deref() == Some("auxiliary"))
        .map(|r| r.seq)
        .context("the auxiliary call's record")?;
    assert_eq!(trained.len(), 2, "{}", t["stats"]);
    assert!(!trained.contains(&auxiliary), "trained: {trained:?}");
    assert_eq!(t["stats"]["excluded_calls"], 1, "{}", t["stats"]);
    assert_eq!(
        t["stats"]["calls_by_class"],
        json!({"auxiliary": 1, "main": 1})
    );
    assert_eq!(summary["excludedCalls"], 1, "{summary}");
    Ok(())
}

/// One call of the agent's own nested 127 levels deep (under `metadata`, which never goes
/// upstream) was answered, but its capture record, a level deeper, was past serde_json's 128:
/// the session's capture no longer read back, its result was a 500 and the session an
/// infrastructure failure, retried, a loss re-rolled at will. Such a body is refused in the
/// caller's shape now, and the deepest body taken reads back: the session ends scored.
#[tokio::test]
async fn a_call_nested_past_what_its_capture_reads_back_is_refused_and_the_session_is_scored(
) -> Result<()> {
    let steps = (0..3).map(|i| Step::Say(format!("answer {i}"))).collect();
    let model = ScriptedUpstream::start(steps).await?;
    let gw = TestGateway::start(&model.url, 16).await?;
    let dataset = tempfile::tempdir()?;
    let http = reqwest::Client::new();
    let assignment = json!({"session": "deep-1", "task": "t", "group": "j/t", "sample": 0,
        "builder": "per_request", "sink": {"kind": "dataset", "dir": dataset.path()}, "run": {}});
    let next = gw.assign_and_take(&assignment).await?;
    let token = next["token"].as_str().context("the session's token")?;
    let chat = format!("{}/v1/chat/completions", gw.url);
    let nested = |depth: usize| {
        format!(
            r#"{{"model":"m","max_tokens":16,"messages":[{{"role":"user","content":"hi"}}],"metadata":{}0{}}}"#,
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
        .into_bytes()
    };
    let (s, b) = call(&http, &chat, token, nested(127)).await?;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("levels deep"),
        "{b}"
    );
    let deepest = nested(floe_gateway::protocol::MAX_JSON_DEPTH);
    for body in [deepest, nested(3)] {
        let (s, b) = call(&http, &chat, token, body).await?;
        assert_eq!(s, 200, "{b}");
    }
    let result = http
        .post(format!("{}/floe/v1/sessions/deep-1/result", gw.url))
        .bearer_auth(&gw.control_token)
        .json(&json!({"status": "completed", "evaluation": {"reward": 0.0}}))
        .send()
        .await?;
    let status = result.status();
    let summary: Value = result.json().await?;
    assert!(status.is_success(), "{status}: {summary}");
    assert_eq!(summary["status"], "completed", "{summary}");
    assert_eq!(summary["completions"], 2, "{summary}");
    assert_eq!(read_session(&gw.session_dir("deep-1"))?.records.len(), 2);
    Ok(())
}

/// A value the model server cannot take (a stop token id of 2^64, which serde reads as a float)
/// is refused by the gateway in the caller's shape, never sent upstream: whatever a server
/// version does with it (vLLM 0.32 answers 400, measured; a 500 would be infrastructure, the
/// session unscored and retried), an agent losing its task cannot turn its loss into "not
/// scored" so (a review's worry, session 85).
#[tokio::test]
async fn a_value_the_model_server_cannot_take_is_refused_in_shape_not_sent() -> Result<()> {
    let model = ScriptedUpstream::start(vec![Step::Say("ok".into())]).await?;
    let gw = TestGateway::start(&model.url, 16).await?;
    let http = reqwest::Client::new();
    let token = gw.session_with("values", "t", 0, json!({})).await?;
    let chat = format!("{}/v1/chat/completions", gw.url);
    let huge = r#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}],"stop_token_ids":[18446744073709551616]}"#;
    let (s, b) = call(&http, &chat, &token, huge.as_bytes().to_vec()).await?;
    assert_eq!(
        (s, b["error"]["type"].as_str()),
        (400, Some("invalid_request_error")),
        "{b}"
    );
    let messages = json!({"model": "m", "max_tokens": 16, "stop_sequences": [7],
        "messages": [{"role": "user", "content": "hi"}]});
    let (s, b) = call_json(&http, &gw.url, "/v1/messages", &token, &messages).await?;
    assert_eq!((s, b["type"].as_str()), (400, Some("error")), "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("stop"),
        "{b}"
    );
    assert!(
        model.requests().is_empty(),
        "nothing reached the model server"
    );
    // And an honest call goes on.
    let fine = json!({"model": "m", "max_tokens": 16, "stop_token_ids": [2],
        "messages": [{"role": "user", "content": "hi"}]});
    let (s, b) = call_json(&http, &gw.url, "/v1/chat/completions", &token, &fine).await?;
    assert_eq!(s, 200, "{b}");
    assert_eq!(model.requests()[0]["stop_token_ids"], json!([2]));
    Ok(())
}

/// An assignment past axum's default body limit (2 MiB): a SWE-bench instance carries its test
/// patch twice (in the instance and in its eval script), and a task's hidden files can be
/// large. The control port takes it whole, and the runner's poll gets it intact (it got a 413,
/// which stopped a whole `floe run`).
#[tokio::test]
async fn an_assignment_as_large_as_a_big_instance_is_taken_whole() -> Result<()> {
    let model = ScriptedUpstream::start(vec![]).await?;
    let gw = TestGateway::start(&model.url, 64).await?;
    let patch = "+ a line of a large test patch\n".repeat(100_000);
    let assignment = json!({"session": "big-1", "task": "t", "group": "j/t", "sample": 0,
        "sink": {"kind": "trainer", "url": "http://127.0.0.1:9"},
        "run": {"task": {"id": "t", "instruction": "x", "hiddenFiles": {"eval.sh": patch}}}});
    let next = gw.assign_and_take(&assignment).await?;
    let taken = next["assignment"]["run"]["task"]["hiddenFiles"]["eval.sh"].as_str();
    assert_eq!(taken.map(str::len), Some(patch.len()));
    Ok(())
}

/// A result whose trajectory could not be spooled (its outcome recorded first: a full disk,
/// say) is spooled when the runner posts it again; it was recorded and never shipped, while the
/// runner's retry did the session again.
#[tokio::test]
async fn a_result_whose_spooling_failed_is_spooled_when_posted_again() -> Result<()> {
    let model = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    let gw = TestGateway::start(&model.url, 64).await?;
    let http = reqwest::Client::new();
    let token = gw.session("spool-1", "t", 0).await?;
    let chat = format!("{}/v1/chat/completions", gw.url);
    let (s, b) = call(
        &http,
        &chat,
        &token,
        serde_json::to_vec(
            &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        )?,
    )
    .await?;
    assert_eq!(s, 200, "{b}");
    let pending = gw
        .capture_dir
        .parent()
        .context("the gateway's directory")?
        .join("spool/pending");
    let aside = pending.with_extension("aside");
    std::fs::rename(&pending, &aside)?;
    std::fs::write(&pending, b"not a directory")?;
    let post = || {
        http.post(format!("{}/floe/v1/sessions/spool-1/result", gw.url))
            .bearer_auth(&gw.control_token)
            .json(&json!({"status": "completed", "evaluation": {"reward": 1.0}}))
            .send()
    };
    let failed = post().await?;
    assert!(failed.status().is_server_error(), "{}", failed.status());
    std::fs::remove_file(&pending)?;
    std::fs::rename(&aside, &pending)?;
    let again = post().await?;
    let status = again.status();
    let summary: Value = again.json().await?;
    assert_eq!(status, 200, "{summary}");
    assert_ne!(summary["shipment"], "none", "{summary}");
    Ok(())
}
