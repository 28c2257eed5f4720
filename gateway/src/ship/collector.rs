//! `floe collect`: the dataset collector of an `sft` RolloutJob. Sandbox pods cannot mount the
//! job's dataset volume (they were started by the pool before the job claimed them), so their
//! gateways ship to this one pod, which owns the volume: the same ingest protocol as the
//! trainer (`POST /v1/trajectories`, idempotent by session), written with the dataset sink
//! (`accepted/<session>.json` or `rejected/<session>.json`, fsynced) and collected into
//! `dataset.jsonl` (accepted only, one trajectory per line, rebuilt from `accepted/` at start
//! so a crash between the two writes cannot leave them disagreeing). When the job finished, the
//! operator posts its summary to `POST /v1/finish`, written as `summary.json` (after
//! `dataset.jsonl` is rebuilt once more: an append that failed part-way may have torn it). One
//! scored record per sample: a retried session's earlier attempt that arrives too (its pod
//! drained after the operator counted it lost) is a repeat, 409; an untrainable one (the
//! infrastructure failure the retry is for) blocks nothing. With a token
//! (the job's ingest token), both posts need it as a bearer token: the sandbox pods reach this
//! port, and an agent shares its pod's network with the gateway.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::Mutex;

use super::{deliver, DeliveryError, Sink, SpoolEntry};
use crate::trajectory::Trajectory;

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("dataset directory {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("cannot listen on {0}: {1}")]
    Listen(std::net::SocketAddr, std::io::Error),
    #[error(transparent)]
    Foreign(#[from] super::dataset_owner::ForeignDataset),
}

/// The run a collector writes for: its job's name and uid (none for a local run).
pub struct Run<'a> {
    pub job: &'a str,
    pub uid: Option<&'a str>,
}

pub struct Collector {
    dir: PathBuf,
    min_reward: Option<f64>,
    http: reqwest::Client,
    /// One ingest at a time: the existence check, the write and the append are one step.
    /// Under it, the (group, sample) of every scored (trainable) record kept.
    lock: Mutex<HashSet<(String, u32)>>,
    token: Option<String>,
    /// The teacher the job's sessions sample (`spec.sft.upstream`, as this collector's pod was
    /// made): written into `summary.json`, so a dataset says which model made it.
    teacher: Option<serde_json::Value>,
}

/// What names a record's sample (the rest of the trajectory is not needed for that).
#[derive(serde::Deserialize)]
struct SampleOf {
    group: String,
    sample: u32,
    #[serde(default)]
    trainable: bool,
}

/// The records kept under `dir`'s `subs` (`accepted`, `rejected`): their `*.json` (a `.tmp`
/// is a write a crash cut short).
fn records(dir: &Path, subs: &[&str]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for sub in subs {
        out.extend(
            std::fs::read_dir(dir.join(sub))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json")),
        );
    }
    Ok(out)
}

impl Collector {
    pub fn open(dir: &Path, min_reward: Option<f64>, run: Run<'_>) -> Result<Self, CollectError> {
        let io = |e| CollectError::Io(dir.to_path_buf(), e);
        std::fs::create_dir_all(dir.join("accepted")).map_err(io)?;
        std::fs::create_dir_all(dir.join("rejected")).map_err(io)?;
        // Before anything is read or written: the directory may be another run's.
        super::dataset_owner::claim(dir, run.job, run.uid)?;
        // The (group, sample) of every scored record kept, read as `dataset.jsonl` is rebuilt
        // from the accepted ones (each record read once: a dataset can be large).
        let mut samples = HashSet::new();
        let mut note = |record: &Path, bytes: &[u8]| match serde_json::from_slice::<SampleOf>(bytes)
        {
            Ok(s) if s.trainable => {
                samples.insert((s.group, s.sample));
            }
            Ok(_) => {}
            Err(e) => tracing::error!(record = %record.display(), "unreadable record: {e}"),
        };
        // Rebuilt whole (a crash may have cut an append short); a volume with no room for a
        // second copy of the dataset keeps its file with any torn last line cut, rather than
        // failing every start (the records in accepted/ are the truth, and `finish` rebuilds
        // again).
        let unread: &[&str] = match rebuild_dataset(dir, &mut note) {
            Ok(()) => &["rejected"],
            Err(e) => {
                tracing::error!(dir = %dir.display(), "cannot rebuild dataset.jsonl: {e}; its torn tail, if any, is cut");
                cut_torn_tail(&dir.join("dataset.jsonl")).map_err(io)?;
                &["accepted", "rejected"]
            }
        };
        for record in records(dir, unread).map_err(io)? {
            note(&record, &std::fs::read(&record).map_err(io)?);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            min_reward,
            http: reqwest::Client::new(),
            lock: Mutex::new(samples),
            token: None,
            teacher: None,
        })
    }

    /// Posts need `Authorization: Bearer <token>`.
    pub fn with_token(self, token: Option<String>) -> Self {
        Self { token, ..self }
    }

    /// The teacher to name in `summary.json`.
    pub fn with_teacher(self, teacher: Option<serde_json::Value>) -> Self {
        Self { teacher, ..self }
    }

    fn seen(&self, session: &str) -> bool {
        ["accepted", "rejected"]
            .iter()
            .any(|sub| self.record(sub, session).exists())
    }

    fn record(&self, sub: &str, session: &str) -> PathBuf {
        self.dir.join(sub).join(format!("{session}.json"))
    }

    /// Whether what is kept of `session` is an untrainable record only: a drained pod's
    /// (an infrastructure failure), which the session's scored record replaces. The operator
    /// runs a session again under the same id when its pod went before the operator marked it
    /// started (a mark lost to a crash), so its drained gateway's record can come first.
    fn untrainable_only(&self, session: &str) -> bool {
        !self.record("accepted", session).exists()
            && std::fs::read(self.record("rejected", session))
                .ok()
                .and_then(|r| serde_json::from_slice::<SampleOf>(&r).ok())
                .is_some_and(|s| !s.trainable)
    }
}

/// `dataset.jsonl` = every accepted trajectory, ordered by session id; `seen` is shown each.
fn rebuild_dataset(dir: &Path, seen: impl FnMut(&Path, &[u8])) -> std::io::Result<()> {
    let mut files = records(dir, &["accepted"])?;
    files.sort();
    super::write_jsonl_durably_seeing(&dir.join("dataset.jsonl"), &files, seen).map(|_| ())
}

/// `path` up to its last newline (nothing if it is not there).
fn cut_torn_tail(path: &Path) -> std::io::Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    if whole < bytes.len() {
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(whole as u64)?;
        file.sync_all()?;
    }
    Ok(())
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

async fn ingest(State(c): State<Arc<Collector>>, body: axum::body::Bytes) -> Response {
    let trajectory: Trajectory = match serde_json::from_slice(&body) {
        Ok(t) => t,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("not a floe trajectory: {e}"),
            )
        }
    };
    if !crate::capture::valid_session_id(&trajectory.session) {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "session id {:?} is not a safe file name",
                trajectory.session
            ),
        );
    }
    // Its own task: a poster that hangs up mid-write must not cut the write from its
    // bookkeeping (the record kept, its sample not marked: a later attempt kept too).
    match tokio::spawn(collect(c, trajectory)).await {
        Ok(answer) => answer,
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Keep `trajectory` unless its session or its scored sample is kept already.
async fn collect(c: Arc<Collector>, trajectory: Trajectory) -> Response {
    let mut samples = c.lock.lock().await;
    let replaces = trajectory.trainable && c.untrainable_only(&trajectory.session);
    if c.seen(&trajectory.session) && !replaces {
        return refuse(StatusCode::CONFLICT, "already collected");
    }
    let sample = (trajectory.group.clone(), trajectory.sample);
    let trainable = trajectory.trainable;
    if samples.contains(&sample) {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "already collected: sample {} of group {} (another attempt's session)",
                sample.1, sample.0
            ),
        );
    }
    let session = trajectory.session.clone();
    let entry = SpoolEntry {
        sink: Sink::Dataset {
            dir: c.dir.clone(),
            min_reward: c.min_reward,
        },
        trajectory,
        rejected: None,
    };
    match deliver(&c.http, &entry).await {
        Ok(_) => {}
        Err(DeliveryError::Retry(e)) => return refuse(StatusCode::SERVICE_UNAVAILABLE, e.message),
        Err(DeliveryError::Permanent(e)) => return refuse(StatusCode::UNPROCESSABLE_ENTITY, e),
    }
    if trainable {
        samples.insert(sample);
    }
    let accepted = c.record("accepted", &session);
    if replaces && accepted.exists() {
        // (Written to `rejected/` instead, it replaced the untrainable record in place.)
        if let Err(e) = std::fs::remove_file(c.record("rejected", &session)) {
            tracing::error!(%session, "the untrainable record it replaces: {e}");
        }
    }
    if accepted.exists() {
        if let Err(e) = append_line(&c.dir.join("dataset.jsonl"), &accepted) {
            // The per-session file is the record; the finish and the next start rebuild
            // dataset.jsonl from the records.
            tracing::error!(%session, "dataset.jsonl: {e}");
        }
        return (
            StatusCode::OK,
            Json(json!({"session": session, "accepted": true})),
        )
            .into_response();
    }
    (
        StatusCode::OK,
        Json(json!({"session": session, "accepted": false})),
    )
        .into_response()
}

/// One line more, or none: an append that fails part-way (a full disk) is cut back to where
/// it began, so no later line joins a torn one (cutting back needs no space).
fn append_line(dataset: &Path, record: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let text = std::fs::read(record)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dataset)?;
    let began = f.metadata()?.len();
    let written = f
        .write_all(text.trim_ascii())
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.sync_data());
    if written.is_err() {
        let _ = f.set_len(began);
    }
    written
}

impl Collector {
    /// Trajectories collected so far: (accepted, rejected).
    fn counts(&self) -> (usize, usize) {
        let count = |sub: &str| records(&self.dir, &[sub]).map_or(0, |r| r.len());
        (count("accepted"), count("rejected"))
    }
}

async fn status(State(c): State<Arc<Collector>>) -> Response {
    let (accepted, rejected) = c.counts();
    Json(json!({"accepted": accepted, "rejected": rejected})).into_response()
}

/// `POST /v1/finish` with the job's summary (the operator's record, once the job finished):
/// written as `summary.json` beside `dataset.jsonl`, with the collector's own counts under
/// `dataset`. Idempotent; the written summary is the answer.
async fn finish(State(c): State<Arc<Collector>>, body: axum::body::Bytes) -> Response {
    let mut summary: serde_json::Map<String, serde_json::Value> =
        match serde_json::from_slice(&body) {
            Ok(s) => s,
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("not a job summary (a JSON object): {e}"),
                )
            }
        };
    // After every ingest already answered: the counts include them.
    let _one = c.lock.lock().await;
    // The dataset the job leaves is what `accepted/` holds, whatever an append that failed on
    // the way left out. A rebuild that fails (a full disk) leaves it as it is, said in the
    // summary: the records are the dataset.
    let rebuilt = rebuild_dataset(&c.dir, |_, _| ());
    if let Err(e) = &rebuilt {
        tracing::error!("rebuilding dataset.jsonl: {e}");
    }
    let (accepted, rejected) = c.counts();
    let seen = accepted + rejected;
    summary.insert(
        "dataset".into(),
        json!({
            "file": "dataset.jsonl",
            "accepted": accepted,
            "rejected": rejected,
            "acceptanceRate": if seen == 0 { 0.0 } else { accepted as f64 / seen as f64 },
        }),
    );
    if let Some(teacher) = &c.teacher {
        summary.insert("teacher".into(), teacher.clone());
    }
    if let Err(e) = rebuilt {
        summary.insert(
            "datasetNotRebuilt".into(),
            json!(format!(
                "{e}: dataset.jsonl may lack lines; accepted/ holds every record"
            )),
        );
    }
    let summary = serde_json::Value::Object(summary);
    let text = match serde_json::to_vec_pretty(&summary) {
        Ok(t) => t,
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if let Err(e) = super::write_durably(&c.dir.join("summary.json"), &text) {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    tracing::info!(accepted, rejected, "wrote summary.json");
    Json(summary).into_response()
}

/// Layer on the two posts: 401 unless the request carries the job's token (when there is one).
async fn require_token(
    State(c): State<Arc<Collector>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match c.token.as_deref() {
        Some(token) if !crate::bearer::carries(request.headers(), token) => refuse(
            StatusCode::UNAUTHORIZED,
            "posting needs `Authorization: Bearer <the job's token>`",
        ),
        Some(_) => {
            crate::serve_limited::Vouch::for_request(&request);
            next.run(request).await
        }
        None => next.run(request).await,
    }
}

pub fn router(c: Arc<Collector>, max_body_bytes: usize) -> Router {
    let posts = Router::new()
        .route("/v1/trajectories", post(ingest))
        .route("/v1/finish", post(finish))
        .route_layer(axum::middleware::from_fn_with_state(
            c.clone(),
            require_token,
        ));
    Router::new()
        .merge(posts)
        .route("/v1/status", get(status))
        .route("/healthz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(c)
}

/// Serve until the shutdown future resolves.
pub async fn serve(
    addr: std::net::SocketAddr,
    collector: Collector,
    max_body_bytes: usize,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), CollectError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CollectError::Listen(addr, e))?;
    tracing::info!(%addr, dir = %collector.dir.display(), "collecting the dataset");
    // Every sandbox pod of the job posts here: a model port's share.
    crate::serve_limited::serve(
        listener,
        router(Arc::new(collector), max_body_bytes),
        crate::serve_limited::Limits::SHARED,
        shutdown,
    )
    .await;
    Ok(())
}
