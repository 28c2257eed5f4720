//! The shipping loop: deliver a spooled trajectory, retrying with backoff until its sink
//! accepts it (moved to `shipped/`) or refuses it (moved to `rejected/`). One loop per session
//! at a time. What happens is told to the [`Shipping`] the loop ships for (the gateway counts
//! it in its metrics and remembers the last failure for the session's status).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::sink::{deliver, DeliveryError, Failure};
use super::spool::{Spool, SpoolEntry};

/// What the loop ships with, and tells what happened.
pub trait Shipping: Send + Sync + 'static {
    fn client(&self) -> &reqwest::Client;
    fn spool(&self) -> &Spool;
    /// Sessions whose loop runs now.
    fn in_flight(&self) -> &Mutex<HashSet<String>>;
    fn report(&self, session: &str, event: Shipped<'_>);
}

/// What became of one delivery attempt, or of a session's loop.
#[derive(Debug)]
pub enum Shipped<'a> {
    /// The loop starts (a trajectory waits in the spool).
    Started,
    /// The sink took it.
    Accepted { target: &'a str },
    /// The sink refused it for good.
    Refused { reason: &'a str },
    /// It failed for now; the next attempt follows in `retry_in`.
    Failed {
        failure: &'a Failure,
        retry_in: Duration,
    },
    /// The loop ends (accepted or refused).
    Ended,
}

/// Backoff between attempts: doubling from 200 ms, at most 30 s.
const FIRST_RETRY: Duration = Duration::from_millis(200);
const LAST_RETRY: Duration = Duration::from_secs(30);

/// Ship `entry` in the background, unless its session's loop already runs.
pub fn spawn<S: Shipping>(shipping: Arc<S>, entry: SpoolEntry) {
    let id = entry.trajectory.session.clone();
    if !crate::sync::lock(shipping.in_flight()).insert(id.clone()) {
        return;
    }
    shipping.report(&id, Shipped::Started);
    tokio::spawn(async move {
        let mut backoff = FIRST_RETRY;
        loop {
            match deliver(shipping.client(), &entry).await {
                Ok(target) => {
                    if let Err(e) = shipping.spool().mark_shipped(&id) {
                        tracing::error!(session = %id, "shipped but not marked: {e}");
                    }
                    shipping.report(&id, Shipped::Accepted { target: &target });
                    break;
                }
                Err(DeliveryError::Permanent(reason)) => {
                    if let Err(e) = shipping.spool().mark_rejected(entry.clone(), &reason) {
                        tracing::error!(session = %id, "cannot move to rejected/: {e}");
                    }
                    shipping.report(&id, Shipped::Refused { reason: &reason });
                    break;
                }
                Err(DeliveryError::Retry(failure)) => {
                    shipping.report(
                        &id,
                        Shipped::Failed {
                            failure: &failure,
                            retry_in: backoff,
                        },
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(LAST_RETRY);
                }
            }
        }
        shipping.report(&id, Shipped::Ended);
        crate::sync::lock(shipping.in_flight()).remove(&id);
    });
}
