//! The controllers' apiserver writes are fenced by the lease. A leader steps down once it has
//! not renewed for `renew_deadline` (two thirds of the lease's duration), but a round already
//! under way went on writing until it ended, and a replica frozen (a stopped process, a frozen
//! cgroup) woke up past its lease, another replica's by then, with
//! its rounds resuming before its renewal loop noticed: two replicas writing, each from its own
//! view (pods claimed twice, sessions counted twice). Every write the controllers' client sends
//! is now refused unless this replica renewed its lease within `renew_deadline`, read from the
//! monotonic clock (which counts time a process spent stopped, not time a paused VM stood
//! still), so a write handed on leaves about a third of the duration, for what lies below the
//! fence, before anyone else may take the lease (see [`crate::clients`]). Reads (the caches'
//! watches among them) are never refused. The lease's own client is not fenced (it renews).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// Until when this replica may write: shared by the leader (which extends it on each renewal)
/// and the fence (which reads it on each write).
#[derive(Clone, Debug)]
pub struct LeaseValidity {
    inner: Option<Arc<Validity>>,
}

#[derive(Debug)]
struct Validity {
    origin: Instant,
    /// Milliseconds after `origin` until which writes may go; 0: not held.
    until_ms: AtomicU64,
}

impl LeaseValidity {
    /// No election (a single replica): every write may go.
    pub fn unelected() -> Self {
        Self { inner: None }
    }

    /// Under election: no write may go until the lease is held.
    pub fn elected() -> Self {
        Self {
            inner: Some(Arc::new(Validity {
                origin: Instant::now(),
                until_ms: AtomicU64::new(0),
            })),
        }
    }

    /// The lease was held as of `sent` (when the winning request left), for `valid_for`.
    pub fn renewed(&self, sent: Instant, valid_for: Duration) {
        if let Some(v) = &self.inner {
            let until = sent.saturating_duration_since(v.origin) + valid_for;
            // At least 1 ms: 0 reads as "not held".
            let ms = u64::try_from(until.as_millis()).unwrap_or(u64::MAX).max(1);
            v.until_ms.store(ms, Ordering::SeqCst);
        }
    }

    /// The lease is lost or given up: no write goes from now on.
    pub fn revoked(&self) {
        if let Some(v) = &self.inner {
            v.until_ms.store(0, Ordering::SeqCst);
        }
    }

    /// Whether a write may go at `now`.
    pub fn holds(&self, now: Instant) -> bool {
        match &self.inner {
            None => true,
            Some(v) => {
                let until = v.until_ms.load(Ordering::SeqCst);
                let elapsed = now.saturating_duration_since(v.origin).as_millis();
                until != 0 && elapsed < u128::from(until)
            }
        }
    }
}

/// A write refused because this replica does not hold the lease now.
#[derive(Debug, thiserror::Error)]
#[error(
    "not sent: this replica does not hold the leader lease now (not renewed within its renew \
     deadline); the replica that holds it acts"
)]
pub struct NotLeader;

/// The fence as a tower layer for the controllers' kube client.
#[derive(Clone, Debug)]
pub struct Fence(pub LeaseValidity);

impl<S> Layer<S> for Fence {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            validity: self.0.clone(),
        }
    }
}

pub struct Fenced<S> {
    inner: S,
    validity: LeaseValidity,
}

type Boxed<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

impl<S, B> Service<http::Request<B>> for Fenced<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Boxed<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let reads = matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        // Checked when the request is handed over, after any wait for the rate limit above.
        if !reads && !self.validity.holds(Instant::now()) {
            tracing::warn!(method = %request.method(), path = %request.uri().path(), "{NotLeader}");
            return Box::pin(std::future::ready(Err(BoxError::from(NotLeader))));
        }
        let sent = self.inner.call(request);
        Box::pin(async move { sent.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn request(method: http::Method) -> http::Request<()> {
        let mut r = http::Request::new(());
        *r.method_mut() = method;
        r
    }

    async fn answered(validity: &LeaseValidity, method: http::Method) -> bool {
        let inner = tower::service_fn(|_: http::Request<()>| async { Ok::<_, BoxError>("sent") });
        Fence(validity.clone())
            .layer(inner)
            .oneshot(request(method))
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn writes_go_only_while_the_lease_was_renewed_within_its_deadline() {
        let validity = LeaseValidity::elected();
        assert!(
            !answered(&validity, http::Method::POST).await,
            "not held yet"
        );
        assert!(
            answered(&validity, http::Method::GET).await,
            "reads always go"
        );
        validity.renewed(Instant::now(), Duration::from_secs(10));
        for write in [
            http::Method::POST,
            http::Method::PUT,
            http::Method::PATCH,
            http::Method::DELETE,
        ] {
            assert!(answered(&validity, write).await);
        }
        // A replica frozen (or its renewals failing) past the deadline: writes stop, reads go.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!answered(&validity, http::Method::PATCH).await);
        assert!(answered(&validity, http::Method::GET).await);
        // Renewed again (the winning request left now): writes go again.
        validity.renewed(Instant::now(), Duration::from_secs(10));
        assert!(answered(&validity, http::Method::PATCH).await);
        validity.revoked();
        assert!(!answered(&validity, http::Method::DELETE).await, "given up");
    }

    #[tokio::test]
    async fn without_an_election_every_write_goes() {
        let validity = LeaseValidity::unelected();
        validity.revoked();
        assert!(answered(&validity, http::Method::POST).await);
    }
}
