//! The gateway's sessions: created only through the control API, looked up by token.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rand::RngExt;

use crate::capture::{
    write_meta, CaptureLog, CaptureWriteError, Durability, SessionMeta, SEAL_FILE,
};

/// Where a session's calls go and with which limits.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Base URL of the OpenAI-compatible server, without `/v1`.
    pub url: String,
    /// Sent as a bearer token on every call (the job's policy server demands it).
    pub api_key: Option<String>,
    pub limits: crate::protocol::upstream::CallLimits,
}

pub struct Session {
    pub meta: SessionMeta,
    pub token: String,
    pub dir: PathBuf,
    pub upstream: Upstream,
    next_seq: AtomicU64,
    /// Prompt and sampled tokens its calls captured so far (its budget's measure).
    captured_tokens: AtomicU64,
    /// Bytes the session's capture holds (the budget's `bytes`).
    captured_bytes: AtomicU64,
    durability: Durability,
    /// `None` once the session is closed (capture sealed).
    log: Mutex<Option<CaptureLog>>,
    /// Its model calls in flight ([`MAX_CALLS_IN_FLIGHT`]).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// Bytes of the bodies of its calls in flight ([`Session::take_place`]).
    body_bytes_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Its calls written to the capture (what a snapshot of it now holds).
    captured_calls: AtomicU64,
    /// Held while a snapshot of it is built and posted (the gateway's snapshot module), so
    /// that snapshots leave in the order of the calls they follow; what the last ones did.
    pub snapshot: tokio::sync::Mutex<Shipped>,
}

/// What a session's snapshots did so far.
#[derive(Debug, Default)]
pub struct Shipped {
    /// Calls the last snapshot the trainer took carried (abandoned ones aside: in no trace).
    pub calls: u64,
    /// Calls captured when the last snapshot taken, or found to carry nothing new, was built:
    /// a call at or below it needs no snapshot of its own.
    pub captured: u64,
    /// When the last snapshot failed, if it did.
    pub failed_at: Option<std::time::Instant>,
    /// Marks of the traces of the last snapshot the trainer took, when it takes deltas.
    pub marks: Option<Vec<crate::trajectory::snapshot_delta::TraceMark>>,
    /// The session's own key for those marks' hashes.
    pub key: std::collections::hash_map::RandomState,
    /// Its capture's records read so far: each snapshot reads only the calls since.
    pub tail: crate::capture::CaptureTail,
}

impl Shipped {
    /// Drop what planning the next snapshot needs (the records read, the marks): the session
    /// is closed ([`Session::close`]).
    fn forget(&mut self) {
        self.tail = Default::default();
        self.marks = None;
    }
}

/// A session's model calls at once. Each holds its body (up to the body limit) several times
/// over and a task that outlives its client; without a bound an agent opening hundreds at once
/// would run the gateway (`floe run` itself, in local mode, outside any sandbox limit) out of
/// memory, every session down with it. Harnesses make one at a time, a few with subagents.
pub const MAX_CALLS_IN_FLIGHT: usize = 16;

/// How many times the body limit a session's calls in flight may hold together. Each body is
/// held several times over while its call runs (parsed, normalized, its capture line), so
/// sixteen calls at the limit took gigabytes: an agent could run the gateway (`floe run`
/// itself, in local mode) out of memory, every session down with it, its own loss unscored.
/// Two: a call at the limit and the rest of a session's ordinary ones.
pub const BODY_LIMITS_IN_FLIGHT: usize = 2;

/// A call's place among its session's calls in flight, and its body's share of their bytes:
/// held until the call is done, even after its client went.
pub struct InFlight {
    _call: tokio::sync::OwnedSemaphorePermit,
    bytes: usize,
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl Session {
    /// A place for a call whose body holds `bytes`, if the bodies in flight stay within
    /// `limit` (one call alone always fits). An `Err` is a 429 in the caller's shape, which
    /// harnesses retry.
    pub fn take_place(
        &self,
        call: tokio::sync::OwnedSemaphorePermit,
        bytes: usize,
        limit: usize,
    ) -> Result<InFlight, crate::protocol::ProtocolError> {
        let mut place = InFlight {
            _call: call,
            bytes: 0,
            held: self.body_bytes_in_flight.clone(),
        };
        place.holds(bytes, limit)?;
        Ok(place)
    }
}

impl InFlight {
    /// The call's body turned out to hold `bytes` (it was reserved by what its
    /// `Content-Length` said, or nothing without one): its share grows to that, if the bodies
    /// in flight stay within `limit` (one call alone always fits).
    pub fn holds(
        &mut self,
        bytes: usize,
        limit: usize,
    ) -> Result<(), crate::protocol::ProtocolError> {
        let more = bytes.saturating_sub(self.bytes);
        let mine = self.bytes;
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                (held == mine || held.saturating_add(more) <= limit).then_some(held + more)
            })
            .map_err(|_| crate::protocol::ProtocolError::TooManyBytes { limit })?;
        self.bytes += more;
        Ok(())
    }
}

impl Session {
    pub fn calls(&self) -> u64 {
        self.next_seq.load(Ordering::SeqCst)
    }

    /// The order number of a call that arrives now, if the session's budget admits one more:
    /// checked and taken in one step, so calls arriving together cannot all pass at the limit.
    /// (Tokens and bytes are spent when a call is captured: calls in flight may overshoot the
    /// budget by what they capture, at most [`MAX_CALLS_IN_FLIGHT`] calls' worth.)
    pub fn admit_call(&self) -> Result<u64, crate::protocol::ProtocolError> {
        let budget = self.upstream.limits.session_budget;
        let tokens = self.captured_tokens.load(Ordering::SeqCst);
        let bytes = self.captured_bytes.load(Ordering::SeqCst);
        let mut refused = None;
        self.next_seq
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |calls| {
                match budget.admit(calls, tokens, bytes) {
                    Ok(()) => Some(calls + 1),
                    Err(e) => {
                        refused = Some(e);
                        None
                    }
                }
            })
            .map_err(|calls| {
                refused.unwrap_or_else(|| {
                    crate::protocol::ProtocolError::SessionBudget(format!(
                        "this session's budget is spent ({calls} calls)"
                    ))
                })
            })
    }

    /// A call's capture took `tokens` tokens of the budget.
    pub fn spend(&self, tokens: usize) {
        self.captured_tokens
            .fetch_add(u64::try_from(tokens).unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    pub fn is_open(&self) -> bool {
        self.log.lock().map(|l| l.is_some()).unwrap_or(false)
    }

    /// Append a line made by [`crate::capture::encode_line`] durably (blocking when the
    /// capture fsyncs: see [`Self::capture_blocks`]).
    pub fn capture_line(&self, line: &[u8]) -> Result<(), CaptureWriteError> {
        let mut guard = self.log.lock().map_err(|_| poisoned(&self.dir))?;
        match guard.as_mut() {
            Some(log) => {
                log.append_line(line)?;
                self.captured_calls.fetch_add(1, Ordering::SeqCst);
                self.captured_bytes
                    .fetch_add(line.len() as u64, Ordering::SeqCst);
                Ok(())
            }
            None => Err(CaptureWriteError::Sealed(self.dir.clone())),
        }
    }

    /// Note that the caller of call `seq` left after its record was written
    /// ([`crate::capture::left`]), while the capture is open: its trajectory is built from the
    /// sealed capture, so a note after that would come too late. Whether it was noted.
    pub fn note_left(&self, seq: u64, at_ms: u64) -> Result<bool, CaptureWriteError> {
        let guard = self.log.lock().map_err(|_| poisoned(&self.dir))?;
        if guard.is_none() {
            return Ok(false);
        }
        crate::capture::left::append(&self.dir, seq, at_ms).map_err(|source| {
            CaptureWriteError::Io {
                path: self.dir.join(crate::capture::left::LEFT_FILE),
                source,
            }
        })?;
        Ok(true)
    }

    /// Its calls written to the capture so far.
    pub fn captured_calls(&self) -> u64 {
        self.captured_calls.load(Ordering::SeqCst)
    }

    /// Whether a capture write waits for the disk (`--capture-fsync`) and so belongs on a
    /// blocking thread. Without it the write only reaches the page cache: microseconds, done
    /// in place (a hop to the blocking pool and back cost more than the write itself).
    pub fn capture_blocks(&self) -> bool {
        self.durability == Durability::Fsync
    }

    /// Seal the capture; later calls with the token are refused. Idempotent.
    pub fn close(self: &Arc<Self>) -> Result<(), CaptureWriteError> {
        let mut guard = self.log.lock().map_err(|_| poisoned(&self.dir))?;
        let sealed = match guard.take() {
            Some(log) => log.seal(),
            None => Ok(()),
        };
        drop(guard);
        self.forget_snapshots();
        sealed
    }

    /// Drop its snapshot state (the records read, the marks): of no more use once it is
    /// closed. A snapshot being posted holds it: it is dropped once that one is done.
    fn forget_snapshots(self: &Arc<Self>) {
        if let Ok(mut shipped) = self.snapshot.try_lock() {
            return shipped.forget();
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let session = self.clone();
            runtime.spawn(async move { session.snapshot.lock().await.forget() });
        }
    }
}

fn poisoned(dir: &Path) -> CaptureWriteError {
    CaptureWriteError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::other("capture lock poisoned by a panic"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session id {0:?} must be 1-240 characters of [A-Za-z0-9._-]")]
    BadId(String),
    #[error(transparent)]
    Capture(#[from] CaptureWriteError),
}

#[derive(Default)]
pub struct Sessions {
    by_id: RwLock<HashMap<String, Arc<Session>>>,
    by_token: RwLock<HashMap<String, Arc<Session>>>,
}

pub use crate::capture::valid_session_id as valid_id;

impl Sessions {
    /// Create a session, or return the existing one with that id (creation is idempotent, so
    /// the operator may retry an assignment). Returns whether it was created.
    pub fn create(
        &self,
        root: &Path,
        meta: SessionMeta,
        durability: Durability,
        upstream: Upstream,
    ) -> Result<(Arc<Session>, bool), SessionError> {
        let token = format!("floe-{}", hex::encode(rand::rng().random::<[u8; 24]>()));
        self.insert(root, meta, durability, token, upstream, true)
    }

    /// Bring back a session found on disk after a gateway restart, with its token: an open
    /// capture takes more calls, a sealed one stays closed.
    pub fn restore(
        &self,
        root: &Path,
        meta: SessionMeta,
        durability: Durability,
        token: String,
        upstream: Upstream,
    ) -> Result<Arc<Session>, SessionError> {
        self.insert(root, meta, durability, token, upstream, false)
            .map(|(s, _)| s)
    }

    fn insert(
        &self,
        root: &Path,
        meta: SessionMeta,
        durability: Durability,
        token: String,
        upstream: Upstream,
        fresh: bool,
    ) -> Result<(Arc<Session>, bool), SessionError> {
        if !valid_id(&meta.session) {
            return Err(SessionError::BadId(meta.session));
        }
        let mut by_id = crate::sync::write(&self.by_id);
        if let Some(existing) = by_id.get(&meta.session) {
            return Ok((existing.clone(), false));
        }
        let dir = root.join(&meta.session);
        let log = if fresh {
            write_meta(&dir, &meta)?;
            Some(CaptureLog::open(&dir, durability)?)
        } else if dir.join(SEAL_FILE).exists() {
            None
        } else {
            Some(CaptureLog::open(&dir, durability)?)
        };
        // A restored session goes on from what its capture holds: its calls' numbering and
        // what they spent.
        let (calls, tokens) = if fresh {
            (0, 0)
        } else {
            crate::capture::read_session_slim(&dir)
                .map(|c| {
                    let calls = c.records.iter().map(|r| r.seq + 1).max().unwrap_or(0);
                    let tokens = c
                        .records
                        .iter()
                        .map(|r| (r.prompt_token_ids.len() + r.completion_token_ids.len()) as u64)
                        .sum();
                    (calls, tokens)
                })
                .unwrap_or((0, 0))
        };
        let bytes =
            std::fs::metadata(dir.join(crate::capture::CAPTURE_FILE)).map_or(0, |m| m.len());
        let session = Arc::new(Session {
            meta,
            token: token.clone(),
            dir,
            upstream,
            next_seq: AtomicU64::new(calls),
            captured_tokens: AtomicU64::new(tokens),
            captured_bytes: AtomicU64::new(bytes),
            durability,
            log: Mutex::new(log),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_CALLS_IN_FLIGHT)),
            body_bytes_in_flight: Arc::default(),
            captured_calls: AtomicU64::new(calls),
            snapshot: tokio::sync::Mutex::default(),
        });
        by_id.insert(session.meta.session.clone(), session.clone());
        crate::sync::write(&self.by_token).insert(token, session.clone());
        Ok((session, true))
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        crate::sync::read(&self.by_id).get(id).cloned()
    }

    /// The open session a model call's token belongs to.
    pub fn by_token(&self, token: &str) -> Option<Arc<Session>> {
        let session = crate::sync::read(&self.by_token).get(token).cloned()?;
        session.is_open().then_some(session)
    }

    /// Forget a session (its capture stays on disk).
    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let session = crate::sync::write(&self.by_id).remove(id)?;
        crate::sync::write(&self.by_token).remove(&session.token);
        Some(session)
    }

    pub fn open_count(&self) -> usize {
        crate::sync::read(&self.by_id)
            .values()
            .filter(|s| s.is_open())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(held: &Arc<std::sync::atomic::AtomicUsize>, bytes: usize) -> InFlight {
        held.fetch_add(bytes, Ordering::SeqCst);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        InFlight {
            _call: slots.try_acquire_owned().expect("a slot"),
            bytes,
            held: held.clone(),
        }
    }

    #[test]
    fn a_body_read_without_a_length_grows_its_share_within_the_bound() {
        let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Alone, any size fits.
        let mut alone = place(&held, 0);
        alone.holds(100, 10).expect("alone");
        assert_eq!(held.load(Ordering::SeqCst), 100);
        drop(alone);
        assert_eq!(held.load(Ordering::SeqCst), 0);
        // Beside another, only within the bound; refused, it keeps what it had.
        let _other = place(&held, 6);
        let mut second = place(&held, 0);
        second.holds(4, 10).expect("within");
        let mut third = place(&held, 0);
        assert!(third.holds(1, 10).is_err());
        assert_eq!(held.load(Ordering::SeqCst), 10);
        drop((second, third));
        assert_eq!(held.load(Ordering::SeqCst), 6);
    }
}
