//! Claims before refills. A RolloutJob's claims and a GatewayPool's refill creates go to the
//! same apiserver from the same operator (one flow to API Priority and Fairness), and a pod
//! create costs the apiserver more than a claim's PATCH. A claim is a session waiting; a
//! refill pod is seconds to minutes from Ready whatever happens. So while any round has
//! claims in flight, a pool's refill waits for them, within a bound per reconcile so that a
//! busy operator never starves its pools.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long one pool reconcile's refill may wait for claims, in all.
pub const REFILL_YIELD_BUDGET: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct ClaimGate {
    in_flight: AtomicUsize,
    quiet: Notify,
}

/// Claims of one round in flight; the gate opens again when the last of these drops.
pub struct ClaimsInFlight(Arc<ClaimGate>);

impl Drop for ClaimsInFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.quiet.notify_waiters();
        }
    }
}

impl ClaimGate {
    /// A round starts claiming.
    pub fn enter(self: &Arc<Self>) -> ClaimsInFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        ClaimsInFlight(self.clone())
    }

    /// Wait until no round is claiming, or until `deadline`. Returns how long it waited.
    pub async fn quiet_by(&self, deadline: Instant) -> Duration {
        let started = Instant::now();
        loop {
            // Registered before the check, so a round that ends in between is not missed.
            let notified = self.quiet.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        started.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_idle_gate_does_not_wait() {
        let gate = Arc::new(ClaimGate::default());
        let waited = gate.quiet_by(Instant::now() + REFILL_YIELD_BUDGET).await;
        assert_eq!(waited, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refill_waits_for_the_last_claiming_round() {
        let gate = Arc::new(ClaimGate::default());
        let first = gate.enter();
        let second = gate.enter();
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.quiet_by(Instant::now() + REFILL_YIELD_BUDGET).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "one round still claims");
        drop(second);
        let waited = waiter.await.expect("waiter");
        assert_eq!(waited, Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refill_never_waits_past_its_deadline() {
        let gate = Arc::new(ClaimGate::default());
        let _forever = gate.enter();
        let waited = gate
            .quiet_by(Instant::now() + Duration::from_millis(500))
            .await;
        assert_eq!(waited, Duration::from_millis(500));
    }
}
