//! Errors a caller sees, rendered in the caller's own protocol shape.

use crate::capture::Api;

/// Something wrong with a request or its upstream call, with the HTTP status it maps to.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("missing or unknown session token")]
    Unauthorized,
    #[error("request body of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("{0}")]
    ContextTooLong(String),
    #[error("upstream model server error: {0}")]
    Upstream(String),
    #[error("upstream model server did not answer in time")]
    UpstreamTimeout,
    #[error("capture failed: {0}")]
    Capture(String),
    #[error("no such endpoint: {0}")]
    NotFound(String),
    #[error("this session already has {limit} model calls in flight: wait for one to finish")]
    TooManyCalls { limit: usize },
    #[error("this session's model calls in flight would hold more than {limit} bytes of request bodies: wait for one to finish")]
    TooManyBytes { limit: usize },
    /// The session's budget is spent (`sampling.maxSessionTokens`, `maxCallsPerSession`).
    #[error("{0}")]
    SessionBudget(String),
}

impl ProtocolError {
    /// Every [`ProtocolError::kind`], so the metric's series exist (at 0) from the start and
    /// ratios and `rate()` in alerts see a zero rather than nothing.
    pub const KINDS: &'static [&'static str] = &[
        "invalid_request",
        "unauthorized",
        "too_large",
        "context_too_long",
        "upstream",
        "upstream_timeout",
        "capture",
        "not_found",
        "too_many_calls",
        "session_budget",
    ];

    pub fn status(&self) -> u16 {
        match self {
            Self::InvalidRequest(_) | Self::ContextTooLong(_) | Self::SessionBudget(_) => 400,
            Self::Unauthorized => 401,
            Self::NotFound(_) => 404,
            Self::TooLarge { .. } => 413,
            Self::TooManyCalls { .. } | Self::TooManyBytes { .. } => 429,
            Self::Upstream(_) => 502,
            Self::UpstreamTimeout => 504,
            Self::Capture(_) => 500,
        }
    }

    /// Label for the `errors_total{kind}` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidRequest(_) => "invalid_request",
            Self::Unauthorized => "unauthorized",
            Self::TooLarge { .. } => "too_large",
            Self::ContextTooLong(_) => "context_too_long",
            Self::Upstream(_) => "upstream",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::Capture(_) => "capture",
            Self::NotFound(_) => "not_found",
            Self::TooManyCalls { .. } | Self::TooManyBytes { .. } => "too_many_calls",
            Self::SessionBudget(_) => "session_budget",
        }
    }

    /// The error body in the shape each provider's SDK parses.
    pub fn body(&self, api: Api) -> serde_json::Value {
        let message = self.to_string();
        match api {
            Api::OpenaiChat | Api::OpenaiResponses => {
                let (kind, code) = match self {
                    Self::Unauthorized => ("authentication_error", "invalid_api_key"),
                    Self::ContextTooLong(_) => ("invalid_request_error", "context_length_exceeded"),
                    Self::InvalidRequest(_) | Self::TooLarge { .. } | Self::NotFound(_) => {
                        ("invalid_request_error", "invalid_request")
                    }
                    Self::TooManyCalls { .. } | Self::TooManyBytes { .. } => {
                        ("requests", "rate_limit_exceeded")
                    }
                    // Not `context_length_exceeded`: a harness answers that by compacting and
                    // calling again.
                    Self::SessionBudget(_) => ("invalid_request_error", "session_budget_exceeded"),
                    _ => ("server_error", "server_error"),
                };
                serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            }
            Api::Anthropic => {
                let kind = match self {
                    Self::Unauthorized => "authentication_error",
                    Self::TooLarge { .. } => "request_too_large",
                    Self::NotFound(_) => "not_found_error",
                    Self::InvalidRequest(_) | Self::ContextTooLong(_) | Self::SessionBudget(_) => {
                        "invalid_request_error"
                    }
                    Self::UpstreamTimeout => "timeout_error",
                    Self::TooManyCalls { .. } | Self::TooManyBytes { .. } => "rate_limit_error",
                    _ => "api_error",
                };
                // The Messages API's own overflow reads "prompt is too long: N tokens > M
                // maximum", the words its clients look for before they compact.
                let message = match self {
                    Self::ContextTooLong(m)
                        if !m.to_lowercase().starts_with("prompt is too long") =>
                    {
                        format!("prompt is too long: {m}")
                    }
                    _ => message,
                };
                serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
            }
            Api::Gemini => {
                let status = match self {
                    Self::Unauthorized => "UNAUTHENTICATED",
                    Self::InvalidRequest(_)
                    | Self::ContextTooLong(_)
                    | Self::TooLarge { .. }
                    | Self::SessionBudget(_) => "INVALID_ARGUMENT",
                    Self::NotFound(_) => "NOT_FOUND",
                    Self::UpstreamTimeout => "DEADLINE_EXCEEDED",
                    Self::TooManyCalls { .. } | Self::TooManyBytes { .. } => "RESOURCE_EXHAUSTED",
                    _ => "INTERNAL",
                };
                serde_json::json!({"error": {"code": self.status(), "message": message, "status": status}})
            }
        }
    }
}

#[cfg(test)]
mod kinds_tests {
    use super::ProtocolError;
    use crate::capture::Api;

    #[test]
    fn an_overflow_reads_as_each_apis_own() {
        let vllm =
            "The decoder prompt (length 9000) is longer than the maximum model length of 8192.";
        let e = ProtocolError::ContextTooLong(vllm.into());
        let anthropic = e.body(Api::Anthropic);
        assert_eq!(anthropic["error"]["type"], "invalid_request_error");
        assert_eq!(
            anthropic["error"]["message"],
            format!("prompt is too long: {vllm}")
        );
        let openai = e.body(Api::OpenaiChat);
        assert_eq!(openai["error"]["code"], "context_length_exceeded");
        assert_eq!(openai["error"]["message"], vllm);
    }

    #[test]
    fn kinds_lists_every_variant() {
        let all = [
            ProtocolError::InvalidRequest(String::new()),
            ProtocolError::Unauthorized,
            ProtocolError::TooLarge { size: 1, limit: 0 },
            ProtocolError::ContextTooLong(String::new()),
            ProtocolError::Upstream(String::new()),
            ProtocolError::UpstreamTimeout,
            ProtocolError::Capture(String::new()),
            ProtocolError::NotFound(String::new()),
            ProtocolError::TooManyCalls { limit: 1 },
            ProtocolError::SessionBudget(String::new()),
        ];
        let kinds: Vec<&str> = all.iter().map(ProtocolError::kind).collect();
        assert_eq!(kinds, ProtocolError::KINDS);
    }
}
