//! Which upstream failures are the infrastructure's, which of them are worth another try, and
//! how long to wait before it (sans-IO).
//!
//! A chat completion has no side effect on the model server, so a call that failed before any
//! answer can be sent again. Retried, until the call's deadline: a connection that could not be
//! made or was cut (a restarting server), 429 (honouring `Retry-After`), 502/503/504 (a proxy or
//! a server not ready). 500 is retried twice only: a request that crashes the server tends to
//! crash it again. Other 4xx are the request's own fault (a context overflow is the policy's)
//! and reach the harness as they are, never counted as the infrastructure's.

use std::time::Duration;

/// One failed attempt of an upstream call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No connection (refused, reset, DNS): nothing reached the server.
    Connect,
    /// The connection broke while the answer was on its way.
    Broken,
    /// The call's deadline passed without an answer.
    Timeout,
    /// An HTTP status that is the server's fault (429 or 5xx).
    Status(u16),
    /// 200 with an answer that is not what the server kind answers (no token ids, not JSON).
    Malformed,
}

impl Failure {
    /// Label of `floe_gateway_upstream_errors_total{kind}` and the key in a session's counts.
    pub fn kind(&self) -> String {
        match self {
            Self::Connect => "connect".into(),
            Self::Broken => "broken".into(),
            Self::Timeout => "timeout".into(),
            Self::Status(s) => format!("http_{s}"),
            Self::Malformed => "malformed".into(),
        }
    }

    /// An upstream status that is the infrastructure's failure (else the request's own): 429,
    /// 5xx, and 401/403, which refuse the gateway's credential (a wrong or missing key), never
    /// the agent's request.
    pub fn from_status(status: u16) -> Option<Self> {
        matches!(status, 401 | 403 | 429 | 500..).then_some(Self::Status(status))
    }
}

/// Every kind the metric starts with (at 0), so `rate()` in alerts sees zeros, not nothing.
pub const KINDS: &[&str] = &[
    "connect",
    "broken",
    "timeout",
    "http_401",
    "http_403",
    "http_429",
    "http_500",
    "http_502",
    "http_503",
    "http_504",
    "malformed",
];

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Wait before the first retry; doubled after each.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Retries of an HTTP 500 (deterministic crashes are common; see the module doc).
    pub max_500_retries: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            first_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(8),
            max_500_retries: 2,
        }
    }
}

impl RetryPolicy {
    /// How long to wait before trying again after `failure` (the `attempt`-th, from 1), or
    /// `None` to give up: not retryable, out of tries, or the wait would pass the deadline
    /// (`remaining` is what is left of it). `retry_after` is the server's own hint.
    pub fn next_delay(
        &self,
        failure: &Failure,
        attempt: u32,
        retry_after: Option<Duration>,
        remaining: Duration,
    ) -> Option<Duration> {
        let retryable = match failure {
            Failure::Connect | Failure::Broken => true,
            Failure::Status(429 | 502 | 503 | 504) => true,
            Failure::Status(500) => attempt <= self.max_500_retries,
            Failure::Status(_) | Failure::Timeout | Failure::Malformed => false,
        };
        if !retryable {
            return None;
        }
        let exponential = self
            .first_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(self.max_backoff);
        let delay = retry_after.map_or(exponential, |hint| hint.max(exponential));
        // Leave the next attempt time to be answered: a retry that can only time out is not one.
        (delay + self.first_backoff < remaining).then_some(delay)
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not sent by model servers).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(3600.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(600);

    #[test]
    fn outages_are_retried_with_doubling_backoff_up_to_the_cap() {
        let p = RetryPolicy::default();
        let delays: Vec<Option<Duration>> = (1..=7)
            .map(|a| p.next_delay(&Failure::Connect, a, None, LONG))
            .collect();
        let ms: Vec<u128> = delays.iter().flatten().map(Duration::as_millis).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 8000, 8000]);
        for status in [429, 502, 503, 504] {
            assert!(p
                .next_delay(&Failure::Status(status), 30, None, LONG)
                .is_some());
        }
    }

    #[test]
    fn the_request_own_errors_and_hangs_are_not_retried() {
        let p = RetryPolicy::default();
        for f in [
            Failure::Timeout,
            Failure::Malformed,
            Failure::Status(501),
            Failure::Status(507),
        ] {
            assert_eq!(p.next_delay(&f, 1, None, LONG), None, "{f:?}");
        }
        assert_eq!(Failure::from_status(400), None);
        assert_eq!(Failure::from_status(404), None);
        // A refused credential is the deployment's fault, and retrying it cannot help.
        for status in [401, 403] {
            let f = Failure::from_status(status).expect("infrastructure");
            assert_eq!(p.next_delay(&f, 1, None, LONG), None);
        }
        assert_eq!(Failure::from_status(429), Some(Failure::Status(429)));
        assert_eq!(Failure::from_status(503), Some(Failure::Status(503)));
    }

    #[test]
    fn a_500_is_retried_twice_only() {
        let p = RetryPolicy::default();
        let tries: Vec<bool> = (1..=4)
            .map(|a| p.next_delay(&Failure::Status(500), a, None, LONG).is_some())
            .collect();
        assert_eq!(tries, [true, true, false, false]);
    }

    #[test]
    fn retry_after_is_honoured_and_the_deadline_bounds_every_wait() {
        let p = RetryPolicy::default();
        let hint = parse_retry_after(" 3 ");
        assert_eq!(hint, Some(Duration::from_secs(3)));
        assert_eq!(
            p.next_delay(&Failure::Status(429), 1, hint, LONG),
            Some(Duration::from_secs(3))
        );
        // Never shorter than our own backoff, whatever the hint says.
        assert_eq!(
            p.next_delay(&Failure::Status(503), 4, Some(Duration::ZERO), LONG),
            Some(Duration::from_secs(2))
        );
        // A wait that would use up the deadline is no retry.
        assert_eq!(
            p.next_delay(&Failure::Connect, 4, None, Duration::from_secs(2)),
            None
        );
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn kinds_name_the_metric_labels() {
        for f in [
            Failure::Connect,
            Failure::Broken,
            Failure::Timeout,
            Failure::Status(429),
            Failure::Status(500),
            Failure::Status(502),
            Failure::Status(503),
            Failure::Status(504),
            Failure::Malformed,
        ] {
            assert!(KINDS.contains(&f.kind().as_str()), "{f:?}");
        }
    }
}
