//! Client-side rate limit for apiserver requests (`--kube-qps`, `--kube-burst`), the same
//! token bucket client-go applies: `burst` requests at once, refilled at `qps` per second.
//! It keeps a burst of claims or pod creations from flooding a shared apiserver (and from
//! tripping API Priority and Fairness for every other tenant).
//!
//! The layer goes under kube's `Buffer`, so one instance sees every request in order: the
//! token is taken in `poll_ready`, as tower intends (readiness reserves capacity for the next
//! `call`). A watch is one request, however long it streams.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Requests per second and how many may go at once. `qps <= 0` means no limit.
#[derive(Clone, Copy, Debug)]
pub struct RateLimit {
    pub qps: f64,
    pub burst: u32,
}

impl<S> Layer<S> for RateLimit {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: Bucket::new(*self),
            sleep: None,
            reserved: false,
        }
    }
}

/// The bucket's arithmetic, apart from the clock and the service plumbing.
#[derive(Debug)]
struct Bucket {
    limit: RateLimit,
    tokens: f64,
    refilled_at: Option<Instant>,
}

impl Bucket {
    fn new(limit: RateLimit) -> Self {
        Bucket {
            limit,
            tokens: f64::from(limit.burst.max(1)),
            refilled_at: None,
        }
    }

    fn unlimited(&self) -> bool {
        // NaN counts as "no limit" too.
        self.limit.qps.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
    }

    /// Take a token at `now`, or say how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if self.unlimited() {
            return Ok(());
        }
        let cap = f64::from(self.limit.burst.max(1));
        if let Some(then) = self.refilled_at {
            let earned = now.saturating_duration_since(then).as_secs_f64() * self.limit.qps;
            self.tokens = (self.tokens + earned).min(cap);
        }
        self.refilled_at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.limit.qps,
            ))
        }
    }
}

pub struct RateLimited<S> {
    inner: S,
    bucket: Bucket,
    sleep: Option<Pin<Box<Sleep>>>,
    /// A token is held for the next `call`.
    reserved: bool,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while !self.reserved {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => self.reserved = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.reserved = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn bucket(qps: f64, burst: u32) -> Bucket {
        Bucket::new(RateLimit { qps, burst })
    }

    #[test]
    fn a_full_bucket_lets_a_burst_through_then_paces_at_qps() {
        let t0 = Instant::now();
        let mut b = bucket(10.0, 3);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        let wait = b.take(t0).expect_err("the burst is spent");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.take(t0 + Duration::from_millis(100)), Ok(()));
        assert!(b.take(t0 + Duration::from_millis(100)).is_err());
    }

    #[test]
    fn an_idle_bucket_refills_only_up_to_burst() {
        let t0 = Instant::now();
        let mut b = bucket(100.0, 2);
        assert_eq!(b.take(t0), Ok(()));
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(later), Ok(()));
        assert_eq!(b.take(later), Ok(()));
        assert!(
            b.take(later).is_err(),
            "a minute idle earns at most `burst` tokens"
        );
    }

    #[test]
    fn zero_or_negative_qps_is_unlimited() {
        let t0 = Instant::now();
        for qps in [0.0, -1.0, f64::NAN] {
            let mut b = bucket(qps, 1);
            for _ in 0..1000 {
                assert_eq!(b.take(t0), Ok(()));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_service_waits_for_tokens_on_the_tokio_clock() {
        let inner = tower::service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n) });
        let mut svc = RateLimit {
            qps: 20.0,
            burst: 5,
        }
        .layer(inner);
        let start = Instant::now();
        for n in 0..25u32 {
            let got = svc.ready().await.expect("ready").call(n).await;
            assert_eq!(got, Ok(n));
        }
        // 5 at once, then 20 more at 20/s: one second on the (paused, auto-advancing) clock.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(999) && took < Duration::from_millis(1010),
            "{took:?}"
        );
    }
}
