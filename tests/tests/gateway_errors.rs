//! The gateway's answers to bad input and a dead upstream, in each caller's own error shape
//! (no model server needed: the upstream is a closed port).

use anyhow::Result;
use floe_gateway::capture::read_session;
use floe_tests::TestGateway;
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
        r#"kind="upstream"} 3"#,
        r#"kind="invalid_request"} 2"#,
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
