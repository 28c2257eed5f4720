//! `floe collect`, the sft job's dataset collector, as a real process: real sandbox sessions
//! (gateway + runner + Pi, scripted model) ship to it over the trainer's ingest protocol; it
//! sorts them by reward, refuses repeats and bad bodies in its own JSON shape, and rebuilds
//! `dataset.jsonl` from the per-session records after a crash; the job's summary is written
//! beside it when the job finished. Only holders of the job's ingest token may post: an
//! agent's own trajectory (a reward it chose) is refused.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::operator::eventually_every;
use floe_tests::toy_task::{default_evaluator, run_session_edited, FIX, WRONG};
use floe_tests::{floe_bin, ScriptedUpstream, Step};
use serde_json::{json, Value};

struct Collector(Child);

/// The job's ingest token, as the operator gives it to the collector and the gateways.
const TOKEN: &str = "the-jobs-ingest-token";
/// The job's teacher (`spec.sft.upstream`), as the operator gives it to the collector.
const TEACHER: &str = r#"{"url":"http://teacher:8000","model":"big","kind":"vLLM"}"#;

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start(dir: &std::path::Path, port: u16) -> Result<Collector> {
    let child = Command::new(floe_bin()?)
        .args([
            "collect",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--min-reward",
            "1",
        ])
        .arg("--dir")
        .arg(dir)
        .env("FLOE_INGEST_TOKEN", TOKEN)
        .env("FLOE_TEACHER", TEACHER)
        .stdout(Stdio::null())
        .spawn()?;
    let collector = Collector(child);
    let health = format!("http://127.0.0.1:{port}/healthz");
    eventually_every(
        Duration::from_millis(50),
        30,
        "floe collect to come up",
        async || Ok(reqwest::get(&health).await.ok().map(|_| ())),
    )
    .await?;
    Ok(collector)
}

#[tokio::test]
async fn sessions_ship_to_the_collector_which_keeps_exactly_one_record_each() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("dataset");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut collector = start(&dir, port).await?;
    let url = format!("http://127.0.0.1:{port}/v1/trajectories");
    let pi = json!({"preset": "pi", "api": "openai-chat", "settings": {"contextWindow": 200000}});
    for (sample, (name, edit)) in [("col-fix", FIX), ("col-wrong", WRONG)]
        .into_iter()
        .enumerate()
    {
        let upstream =
            ScriptedUpstream::start(vec![Step::Shell(edit.into()), Step::Say("Done.".into())])
                .await?;
        // Two samples of the task: the collector keeps one scored record per sample.
        let run = run_session_edited(name, &pi, &upstream.url, &default_evaluator(), |a| {
            a["sink"] = json!({"kind": "trainer", "url": url, "token": TOKEN});
            a["sample"] = json!(sample);
        })
        .await?;
        assert_eq!(run.summary["shipment"], "shipped", "{}", run.summary);
        assert_eq!(run.summary["trajectory"], url.as_str());
    }
    // minReward 1: the fix is accepted, the wrong edit rejected; the dataset holds the fix.
    let accepted: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("accepted/col-fix.json"))?)?;
    assert_eq!(accepted["reward"], 1.0);
    assert!(dir.join("rejected/col-wrong.json").exists());
    let lines = std::fs::read_to_string(dir.join("dataset.jsonl"))?;
    assert_eq!(lines.lines().count(), 1);
    // A refused post's body is never read, so the server closes that connection: no reuse.
    let raw = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    // An agent's own trajectory, without the token or with its session's: refused, not kept.
    let mut forged: Value = serde_json::from_str(&std::fs::read_to_string(
        dir.join("rejected/col-wrong.json"),
    )?)?;
    forged["session"] = json!("col-forged");
    forged["reward"] = json!(1.0);
    for token in [None, Some("session-token")] {
        let mut post = raw.post(&url).json(&forged);
        if let Some(t) = token {
            post = post.bearer_auth(t);
        }
        assert_eq!(post.send().await?.status(), 401);
    }
    assert!(!dir.join("accepted/col-forged.json").exists());
    let finish = format!("http://127.0.0.1:{port}/v1/finish");
    assert_eq!(
        raw.post(&finish).json(&json!({})).send().await?.status(),
        401
    );
    let http = reqwest::Client::builder()
        .default_headers(reqwest::header::HeaderMap::from_iter([(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {TOKEN}").parse()?,
        )]))
        .build()?;
    let status: Value = http
        .get(format!("http://127.0.0.1:{port}/v1/status"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(status, json!({"accepted": 1, "rejected": 1}));

    // A repeat (a gateway retrying after a lost reply) is 409, which the sink counts as done.
    let again = http.post(&url).json(&accepted).send().await?;
    assert_eq!(again.status(), 409);
    // Another attempt of a scored sample (the operator retried a pod it counted lost, whose
    // gateway shipped attempt 0 as it drained): one record per sample, or the task has
    // numSamples + 1 and the summary disagrees with the job's counts.
    let mut retried = accepted.clone();
    retried["session"] = json!("col-fix-r1");
    let twice = http.post(&url).json(&retried).send().await?;
    assert_eq!(twice.status(), 409);
    assert!(!dir.join("accepted/col-fix-r1.json").exists());
    // An infrastructure failure blocks nothing: its retry's scored record is kept.
    let mut failed = accepted.clone();
    failed["session"] = json!("col-other");
    failed["sample"] = json!(7);
    failed["trainable"] = json!(false);
    failed["reward"] = Value::Null;
    failed["status"] = json!("error");
    assert_eq!(http.post(&url).json(&failed).send().await?.status(), 200);
    let mut redone = accepted.clone();
    redone["session"] = json!("col-other-r1");
    redone["sample"] = json!(7);
    assert_eq!(http.post(&url).json(&redone).send().await?.status(), 200);
    // Nor under the session's own id: the operator runs a session again at the same attempt
    // when its pod went before it was marked started, whose drained gateway shipped first.
    let mut drained = failed.clone();
    drained["session"] = json!("col-same");
    drained["sample"] = json!(8);
    assert_eq!(http.post(&url).json(&drained).send().await?.status(), 200);
    assert!(dir.join("rejected/col-same.json").exists());
    let mut scored = accepted.clone();
    scored["session"] = json!("col-same");
    scored["sample"] = json!(8);
    assert_eq!(http.post(&url).json(&scored).send().await?.status(), 200);
    assert!(dir.join("accepted/col-same.json").exists());
    assert!(!dir.join("rejected/col-same.json").exists());
    // Once scored, it is a repeat, untrainable or not.
    for again in [&scored, &drained] {
        assert_eq!(http.post(&url).json(again).send().await?.status(), 409);
    }
    // A write a crash cut short is no record.
    std::fs::write(dir.join("accepted/col-cut.json.tmp"), "{")?;
    // Bad bodies get a 4xx that says why, in the collector's JSON shape.
    let bad = http.post(&url).body("{\"format\": 1}").send().await?;
    assert_eq!(bad.status(), 400);
    let why: Value = bad.json().await?;
    assert!(
        why["error"]
            .as_str()
            .is_some_and(|e| e.contains("not a floe trajectory")),
        "{why}"
    );
    let mut sneaky = accepted.clone();
    sneaky["session"] = json!("../../etc/x");
    assert_eq!(http.post(&url).json(&sneaky).send().await?.status(), 400);
    // A passing session with no token to train (every call abandoned, of an excluded class,
    // or not to be imitated) is no example: kept, as rejected.
    let mut empty = accepted.clone();
    empty["session"] = json!("col-empty");
    empty["sample"] = json!(9);
    for trace in empty["traces"].as_array_mut().into_iter().flatten() {
        let n = trace["loss_mask"].as_array().map_or(0, Vec::len);
        trace["loss_mask"] = json!(vec![0; n]);
    }
    assert_eq!(http.post(&url).json(&empty).send().await?.status(), 200);
    assert!(dir.join("rejected/col-empty.json").exists());
    assert!(!dir.join("accepted/col-empty.json").exists());

    // The job finished: the operator's summary is written beside the dataset, with the
    // collector's counts; again (an operator restarted before it deleted the pod) the same.
    let record = json!({"job": "col", "mode": "sft", "sessions": {"total": 2, "completed": 2}});
    for _ in 0..2 {
        let answer = http.post(&finish).json(&record).send().await?;
        assert_eq!(answer.status(), 200);
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json"))?)?;
        assert_eq!(written, answer.json::<Value>().await?);
        assert_eq!(written["sessions"], record["sessions"]);
        // The dataset says which model made it.
        assert_eq!(written["teacher"], serde_json::from_str::<Value>(TEACHER)?);
        assert_eq!(
            written["dataset"],
            json!({"file": "dataset.jsonl", "accepted": 3, "rejected": 3, "acceptanceRate": 0.5})
        );
        // The dataset the job leaves is what accepted/ holds, whole.
        let lines = std::fs::read_to_string(dir.join("dataset.jsonl"))?;
        assert_eq!(lines.lines().count(), 3, "{lines}");
        // An append that failed part-way tore it: the finish writes it whole again.
        std::fs::write(dir.join("dataset.jsonl"), format!("{lines}{{\"torn"))?;
    }
    let bad = http.post(&finish).body("[1]").send().await?;
    assert_eq!(bad.status(), 400);
    assert!(bad.json::<Value>().await?["error"]
        .as_str()
        .is_some_and(|e| e.contains("not a job summary")));

    // A crash that tore dataset.jsonl: the restart rebuilds it from accepted/.
    drop(collector);
    std::fs::write(dir.join("dataset.jsonl"), "{\"torn")?;
    collector = start(&dir, port).await?;
    let rebuilt = std::fs::read_to_string(dir.join("dataset.jsonl"))?;
    let line: Value = serde_json::from_str(rebuilt.lines().next().context("a line")?)?;
    assert_eq!(line["session"], "col-fix");
    assert_eq!(rebuilt.lines().count(), 3);
    // The restarted collector still knows which samples it has.
    assert_eq!(http.post(&url).json(&retried).send().await?.status(), 409);
    drop(collector);
    Ok(())
}

/// A volume with no room for a second copy of the dataset: the collector's start rebuilt
/// `dataset.jsonl` beside itself first, failed, and so failed every restart (its gateways then
/// gave their sessions up as infrastructure). It comes up, the file's torn tail cut.
#[tokio::test]
async fn a_collector_that_cannot_rebuild_its_dataset_still_starts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // The rebuild's temporary file cannot be written: a directory holds its name.
    std::fs::create_dir_all(dir.path().join("dataset.jsonl.tmp/x"))?;
    std::fs::write(dir.path().join("dataset.jsonl"), "{\"a\":1}\n{\"torn")?;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let _collector = start(dir.path(), port).await?;
    assert_eq!(
        std::fs::read_to_string(dir.path().join("dataset.jsonl"))?,
        "{\"a\":1}\n"
    );
    Ok(())
}

/// A job deleted and made again under its name, on the same dataset directory: its sessions
/// have the earlier run's ids, and the collector answered each "already kept" (409), which
/// its gateways took as delivered. The directory is its first run's; another run's collector
/// stops at start with what to do, as its pod's termination message.
#[tokio::test]
async fn a_collector_refuses_the_dataset_of_another_run_of_its_job() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let run = |uid: &str| {
        Command::new(floe_bin()?)
            .args(["collect", "--listen", "127.0.0.1:0", "--job", "distil"])
            .args(["--job-uid", uid])
            .arg("--dir")
            .arg(dir.path())
            .env("FLOE_INGEST_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("floe collect")
    };
    // The first run's collector takes the directory and serves.
    let mut first = Collector(run("uid-1")?);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        first.0.try_wait()?.is_none(),
        "the first run's collector stopped"
    );
    drop(first);
    let second = run("uid-2")?.wait_with_output()?;
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{said}");
    assert!(
        said.contains("another run of job \"distil\" (uid uid-1; this run is uid uid-2)"),
        "{said}"
    );
    // The first run restarted keeps its directory.
    let mut again = Collector(run("uid-1")?);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        again.0.try_wait()?.is_none(),
        "the first run's collector, restarted, stopped"
    );
    Ok(())
}
