//! Crashes around a sandbox session lose no captured completion: a gateway killed after the
//! outcome was recorded but before the trainer took the trajectory ships it after its restart,
//! exactly once; a sandbox whose runner and harness die mid-session still ships what was
//! captured when the pod goes away — as an untrainable infrastructure failure, never reward 0;
//! a train job's session killed with its gateway (an eviction: no grace period) has already
//! left a snapshot of each call, posted before the agent got the reply, and the trainer's own
//! ingest, sent every snapshot after the first as a delta, scores the very session built from
//! its capture.
//! Real `floe gateway` / `floe sandbox` processes, Pi from npm, the scripted upstream, a
//! recording trainer-ingest stand-in and the trainer's own ingest.

use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::{
    floe_bin, harness_bin_dir, kill_session, spawn_sandbox, wait_child, GatewayProcess,
    ScriptedUpstream, Step, TestIngest, TrainerIngest,
};
use serde_json::{json, Value};

fn assignment(session: &str, trainer: &str) -> Value {
    json!({
        "session": session, "task": "hello", "group": "job-1/hello", "sample": 1,
        "sink": {"kind": "trainer", "url": trainer},
        "run": {
            "task": {"id": "hello", "instruction": "Create hello.txt saying hi."},
            "harness": {"preset": "pi", "settings": {"contextWindow": 200000}},
            "evaluator": {"command": ["grep", "-q", "hi", "hello.txt"]},
            "timeouts": {"agentSeconds": 120, "evaluatorSeconds": 30},
        },
    })
}

/// A train job's on a cluster: its gateway posts a snapshot of the session after each call.
fn train_job_assignment(session: &str, trainer: &str) -> Value {
    let mut a = assignment(session, trainer);
    a["sink"]["snapshots"] = true.into();
    a
}

async fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while !check() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_before_shipping_ships_the_spooled_trajectory_once_after_restart(
) -> Result<()> {
    let pi = harness_bin_dir("pi")?;
    let upstream = ScriptedUpstream::start(vec![
        Step::Shell("echo hi > hello.txt".into()),
        Step::Say("Created.".into()),
    ])
    .await?;
    let trainer = TestIngest::start().await?;
    trainer.set_down(true);
    let root = tempfile::tempdir()?;
    let mut gateway = GatewayProcess::start(&root.path().join("gw"), &upstream.url, &[]).await?;
    let mut runner = spawn_sandbox(&gateway, root.path(), &[pi])?;
    gateway
        .assign(&assignment("spooled-1", &trainer.url))
        .await?;

    // The session finishes and is scored; the trainer is down, so it waits in the spool.
    let pending = gateway.root.join("captures/.spool/pending/spooled-1.json");
    wait_for("the spooled trajectory", Duration::from_secs(120), || {
        pending.exists()
    })
    .await?;
    // Why it waits, where the runner (and a user) reads it: the failed delivery's cause.
    let mut outcome = Value::Null;
    for _ in 0..50 {
        outcome = gateway
            .control(reqwest::Method::GET, "/floe/v1/sessions/spooled-1", None)
            .await?
            .1;
        if outcome["shipmentError"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(outcome["shipment"], "pending", "{outcome}");
    assert!(
        outcome["shipmentError"]
            .as_str()
            .is_some_and(|e| e.contains("503")),
        "{outcome}"
    );
    let metrics = reqwest::get(format!("{}/metrics", gateway.url))
        .await?
        .text()
        .await?;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("floe_gateway_delivery_errors_total{kind=\"http_503\"}")),
        "{metrics}"
    );
    gateway.kill(); // SIGKILL: a crash after capture, before shipping
    kill_session(&mut runner)?;
    assert!(trainer.accepted().is_empty());

    trainer.set_down(false);
    gateway.restart().await?;
    wait_for("delivery after restart", Duration::from_secs(30), || {
        trainer.accepted().contains_key("spooled-1")
    })
    .await?;
    let shipped = gateway.root.join("captures/.spool/shipped/spooled-1.json");
    wait_for("the shipped mark", Duration::from_secs(10), || {
        shipped.exists()
    })
    .await?;
    // A second restart finds nothing left to ship.
    gateway.restart().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let accepted = trainer.accepted();
    let deliveries = accepted.get("spooled-1").context("delivered")?;
    assert_eq!(
        deliveries.len(),
        1,
        "delivered exactly once: {deliveries:?}"
    );
    let t = &deliveries[0];
    assert_eq!(t["reward"], 1.0);
    assert_eq!(t["trainable"], true);
    assert_eq!(t["stats"]["completions"], 2);
    assert!(!pending.exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_dying_mid_session_still_ships_its_captured_calls_as_untrainable() -> Result<()> {
    let pi = harness_bin_dir("pi")?;
    // The first call makes the agent run a long command; the sandbox dies while it runs.
    let upstream = ScriptedUpstream::start(vec![
        Step::Shell("sleep 60".into()),
        Step::Say("never reached".into()),
    ])
    .await?;
    let trainer = TestIngest::start().await?;
    let root = tempfile::tempdir()?;
    let mut gateway = GatewayProcess::start(&root.path().join("gw"), &upstream.url, &[]).await?;
    let mut runner = spawn_sandbox(&gateway, root.path(), &[pi])?;
    gateway.assign(&assignment("dying-1", &trainer.url)).await?;
    wait_for("the first model call", Duration::from_secs(120), || {
        upstream.calls() >= 1
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    kill_session(&mut runner)?; // the runner, Pi and its `sleep`: the container is gone

    // The pod is deleted: the gateway gets SIGTERM and drains.
    let status = gateway.terminate()?;
    assert!(
        status.success(),
        "gateway exit {status}; log:\n{}",
        gateway.log()
    );
    let accepted = trainer.accepted();
    let deliveries = accepted
        .get("dying-1")
        .with_context(|| format!("captured calls shipped; gateway log:\n{}", gateway.log()))?;
    assert_eq!(deliveries.len(), 1);
    let t = &deliveries[0];
    assert_eq!(t["trainable"], false);
    assert_eq!(t["status"], "error");
    assert!(
        t["reward"].is_null(),
        "never a reward of 0: {}",
        t["reward"]
    );
    assert_eq!(t["stats"]["completions"], 1);
    // Not a train job's on a cluster: no snapshot was posted.
    assert!(trainer.partials().is_empty());
    assert!(t["traces"][0]["response_token_ids"]
        .as_array()
        .is_some_and(|ids| !ids.is_empty()));
    let _ = wait_child(&mut runner, Duration::from_secs(1)).await;
    Ok(())
}

/// The kubelet evicts a pod with no grace period: the gateway dies with the agent and ships
/// nothing more. Every call already left: its snapshot reached the trainer before its reply
/// reached the agent, so what the agent did with the reply (here: the command it ran) comes
/// after. The trainer scores it 0 if the operator rules the eviction the agent's doing. The
/// trainer takes a second over each snapshot: one posted beside the reply, not before it,
/// would arrive after the agent acted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_killed_without_grace_left_a_snapshot_of_each_call_before_its_reply() -> Result<()>
{
    let pi = harness_bin_dir("pi")?;
    let root = tempfile::tempdir()?;
    let acted = root.path().join("workspace/acted");
    let upstream = ScriptedUpstream::start(vec![
        Step::Shell("echo one > first.txt".into()),
        Step::Shell("touch acted; sleep 60".into()),
        Step::Say("never reached".into()),
    ])
    .await?;
    let trainer = TestIngest::start().await?;
    trainer.set_partial_delay(Duration::from_secs(1));
    let mut gateway = GatewayProcess::start(&root.path().join("gw"), &upstream.url, &[]).await?;
    let mut runner = spawn_sandbox(&gateway, root.path(), &[pi])?;
    gateway
        .assign(&train_job_assignment("evicted-1", &trainer.url))
        .await?;
    wait_for(
        "the agent to act on the second reply",
        Duration::from_secs(120),
        || acted.exists(),
    )
    .await?;
    // Read before anything else can post: the second call's snapshot is already there.
    let partials = trainer.partials();
    gateway.kill();
    kill_session(&mut runner)?;
    let snapshots = partials
        .get("evicted-1")
        .with_context(|| format!("no snapshot; gateway log:\n{}", gateway.log()))?;
    let completions: Vec<&Value> = snapshots
        .iter()
        .map(|t| &t["stats"]["completions"])
        .collect();
    assert_eq!(
        completions,
        [&json!(1), &json!(2)],
        "one snapshot per call, in order"
    );
    let last = &snapshots[1];
    assert_eq!(
        (&last["status"], &last["trainable"], &last["reward"]),
        (&json!("interrupted"), &json!(false), &Value::Null),
        "{last}"
    );
    assert_eq!(
        (&last["group"], &last["sample"]),
        (&json!("job-1/hello"), &json!(1))
    );
    // Its masks as built, for a ruling: every sampled token would train.
    assert_eq!(
        last["stats"]["trainable_tokens"],
        last["stats"]["sampled_tokens"]
    );
    assert!(
        last["stats"]["sampled_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{last}"
    );
    // And no trajectory: nothing else left the pod.
    assert!(trainer.accepted().is_empty());
    let _ = wait_child(&mut runner, Duration::from_secs(1)).await;
    Ok(())
}

/// An evicted session's snapshot, as the trainer's own ingest scores it, is the session its
/// capture holds, whichever builder: the gateway sent the first snapshot whole and each later
/// one as the change to the last (a `per_request` session's earlier calls as indices, a merged
/// chain as the tokens it grew by), and the ingest's files add up to the last. Once, the
/// trainer is lost and started again between two calls: it holds no base, answers the next
/// delta 409, is sent that snapshot whole, and the deltas go on from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_sent_as_deltas_add_up_at_the_trainer_to_the_session_captured() -> Result<()> {
    for (builder, restart) in [
        ("per_request", false),
        ("prefix_merging", false),
        ("prefix_merging", true),
    ] {
        let pi = harness_bin_dir("pi")?;
        let root = tempfile::tempdir()?;
        let workspace = root.path().join("workspace");
        let upstream = ScriptedUpstream::start(vec![
            Step::Shell("echo one > one.txt".into()),
            Step::Shell("touch waiting; while [ ! -e go ]; do sleep 0.1; done".into()),
            Step::Shell("echo three > three.txt".into()),
            Step::Shell("touch acted; sleep 60".into()),
            Step::Say("never reached".into()),
        ])
        .await?;
        let mut trainer = TrainerIngest::start(&root.path().join("ingest"))?;
        let mut gateway =
            GatewayProcess::start(&root.path().join("gw"), &upstream.url, &[]).await?;
        let mut runner = spawn_sandbox(&gateway, root.path(), &[pi])?;
        let mut assigned = train_job_assignment("evicted-2", &trainer.url);
        assigned["builder"] = builder.into();
        gateway.assign(&assigned).await?;
        wait_for(
            "the agent to act on the second reply",
            Duration::from_secs(120),
            || workspace.join("waiting").exists(),
        )
        .await?;
        if restart {
            trainer.restart()?;
        }
        std::fs::write(workspace.join("go"), "")?;
        wait_for(
            "the agent to act on the fourth reply",
            Duration::from_secs(120),
            || workspace.join("acted").exists(),
        )
        .await?;
        let counts = trainer.status().await?["ingest"].clone();
        let metrics = reqwest::get(format!("{}/metrics", gateway.url))
            .await?
            .text()
            .await?;
        gateway.kill();
        kill_session(&mut runner)?;
        let _ = wait_child(&mut runner, Duration::from_secs(1)).await;
        // Four calls, four snapshots kept: the first whole, three deltas; after a restart
        // between the second and third, this trainer took the third whole and the fourth.
        let (kept, deltas) = if restart { (2, 1) } else { (4, 3) };
        assert_eq!(
            (&counts["partial"], &counts["partialDeltas"]),
            (&json!(kept), &json!(deltas)),
            "{builder}, restart {restart}: {counts}\ngateway log:\n{}",
            gateway.log()
        );
        let bytes = |kind: &str| -> u64 {
            let series = format!("floe_gateway_snapshot_bytes_total{{kind=\"{kind}\"}} ");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        assert!(bytes("whole") > 0 && bytes("delta") > 0, "{metrics}");
        assert!(
            metrics.contains("floe_gateway_snapshots_total{result=\"failed\"} 0"),
            "a refused delta is no failed snapshot: {metrics}"
        );

        // The operator's ruling, taken by a trainer started since: it has only the files.
        let said = trainer.score_partial("evicted-2", "job-1/hello", 1)?;
        assert_eq!(said["scored"], true, "{builder}: {said}");
        let stored: Value =
            serde_json::from_slice(&std::fs::read(trainer.dir.join("evicted-2.json"))?)?;
        let built = std::process::Command::new(floe_bin()?)
            .args(["trajectories", "build", "--builder", builder])
            .arg(gateway.root.join("captures/evicted-2"))
            .output()?;
        anyhow::ensure!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let captured: Value = serde_json::from_slice(&built.stdout)?;
        assert_eq!(captured["stats"]["completions"], 4, "{}", captured["stats"]);
        assert_eq!(
            stored["traces"], captured["traces"],
            "{builder}: the snapshot scored is the session captured"
        );
        assert_eq!(stored["stats"], captured["stats"]);
        assert_eq!(
            (&stored["status"], &stored["trainable"], &stored["reward"]),
            (&json!("interrupted"), &json!(true), &json!(0.0))
        );
    }
    Ok(())
}
