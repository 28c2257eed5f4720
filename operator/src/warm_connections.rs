//! Connections open before a burst needs them. kube's client speaks HTTP/1.1: one request at a
//! time per connection, and one opened on demand costs a TCP and TLS handshake, most of it on
//! the apiserver (measured on the test apiserver: 2.8–3.9 ms of its CPU, against 0.15–0.25 ms
//! for a request on an open connection). A job's first round claims a whole warm pool at once
//! with `round_parallelism` PATCHes in flight, so without this each of those first PATCHes
//! would pay a handshake inside a session's claim latency.
//!
//! So while the controllers run, every [`REWARM_EVERY`] this sends that many cheap requests
//! (`GET /version`) at once: the client's pool opens the connections it lacks and every idle one
//! is used again before the pool's 90 s idle timeout closes it. HTTP/2 (one multiplexed
//! connection, as client-go does) was measured instead and made every later claim slower
//! (`docs/benchmarks.md`, session 11).

use std::time::Duration;

use kube::Client;

/// Under the client pool's 90 s idle timeout, with room for a slow round of warming.
pub const REWARM_EVERY: Duration = Duration::from_secs(30);

/// Keep `connections` connections to the apiserver open, until dropped (aborted).
pub async fn keep_warm(client: Client, connections: usize) {
    if connections == 0 {
        return;
    }
    loop {
        let answered = warm_once(&client, connections).await;
        tracing::debug!(connections, answered, "apiserver connections warmed");
        tokio::time::sleep(REWARM_EVERY).await;
    }
}

/// Send `connections` requests at once; returns how many were answered. The requests are
/// all in flight together, so none can reuse another's connection: the pool ends up holding
/// at least that many.
pub async fn warm_once(client: &Client, connections: usize) -> usize {
    let answers =
        futures::future::join_all((0..connections).map(|_| client.apiserver_version())).await;
    let mut answered = 0;
    for answer in answers {
        match answer {
            Ok(_) => answered += 1,
            Err(e) => tracing::debug!("warming an apiserver connection: {e}"),
        }
    }
    answered
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A stand-in apiserver that answers `/version` after a while and records how many
    /// requests it held at once.
    fn counting_client(at_once: Arc<AtomicUsize>, most: Arc<AtomicUsize>) -> Client {
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (at_once, most) = (at_once.clone(), most.clone());
            async move {
                assert_eq!(request.uri().path(), "/version");
                let now = at_once.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                at_once.fetch_sub(1, Ordering::SeqCst);
                let body = serde_json::json!({
                    "major": "1", "minor": "20", "gitVersion": "v1.20.2", "gitCommit": "",
                    "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "",
                    "platform": "linux/amd64"
                });
                Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                    serde_json::to_vec(&body).unwrap_or_default(),
                )))
            }
        });
        Client::new(service, "default")
    }

    #[tokio::test]
    async fn warming_holds_as_many_requests_at_once_as_connections_wanted() {
        let (at_once, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let client = counting_client(at_once, most.clone());
        assert_eq!(warm_once(&client, 12).await, 12);
        assert_eq!(most.load(Ordering::SeqCst), 12);
    }

    #[tokio::test]
    async fn no_connections_wanted_sends_nothing() {
        let (at_once, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let client = counting_client(at_once, most.clone());
        tokio::time::timeout(Duration::from_secs(1), keep_warm(client, 0))
            .await
            .expect("returns at once");
        assert_eq!(most.load(Ordering::SeqCst), 0);
    }
}
