//! A sandbox pod checks at start that its egress is restricted. Its containers share one
//! network namespace, so what the grader can reach the agent can too. Every container learns
//! the Kubernetes API's Service address from the kubelet (`KUBERNETES_SERVICE_HOST`/`_PORT`,
//! set whatever `enableServiceLinks` says), and no sandbox egress rule allows it: a connection
//! there means the pool's NetworkPolicy is not enforced (a CNI without NetworkPolicy support)
//! or something opened it. An enforcing CNI drops or rejects the attempt.

use std::time::Duration;

/// What a pool's pods do when their egress is open (`FLOE_EGRESS_CHECK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EgressCheck {
    /// Log it, count it (`floe_gateway_egress_unrestricted`) and serve.
    Warn,
    /// End before READY, saying why.
    Refuse,
}

impl std::str::FromStr for EgressCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "warn" => Ok(Self::Warn),
            "refuse" => Ok(Self::Refuse),
            other => Err(format!("{other:?} is not warn or refuse")),
        }
    }
}

/// How long a connection may take before the address counts as unreachable.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What this pod reached that its egress policy should refuse; `None` when nothing (or when
/// the kubelet gave no Kubernetes API address: nothing to check against).
pub async fn unrestricted() -> Option<String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok()?;
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    reachable(&addr, PROBE_TIMEOUT)
        .await
        .then(|| format!("it reached the Kubernetes API at {addr}"))
}

/// Whether a TCP connection to `addr` opens within `timeout`.
pub async fn reachable(addr: &str, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_open_port_is_reached_and_a_closed_one_is_not() -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let open = listener.local_addr()?.to_string();
        assert!(reachable(&open, PROBE_TIMEOUT).await);
        drop(listener);
        assert!(
            !reachable(&open, PROBE_TIMEOUT).await,
            "refused is unreachable"
        );
        Ok(())
    }

    #[test]
    fn the_mode_comes_from_the_operators_words() {
        assert_eq!("warn".parse(), Ok(EgressCheck::Warn));
        assert_eq!("refuse".parse(), Ok(EgressCheck::Refuse));
        assert!("Refuse".parse::<EgressCheck>().is_err());
    }
}
