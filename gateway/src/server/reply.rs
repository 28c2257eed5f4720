//! The control API's answers: JSON `{"error": ...}` with a status, and the status each kind of
//! refusal gets.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::session_store::StoreError;

/// The `reason` of a 409 for a session assigned before with other content.
pub const ASSIGNED_DIFFERENTLY: &str = "AssignedDifferently";

pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

impl IntoResponse for StoreError {
    fn into_response(self) -> Response {
        let status = match &self {
            StoreError::NoSession(_) => StatusCode::NOT_FOUND,
            StoreError::AssignedDifferently(_)
            | StoreError::DifferentOutcome(_)
            | StoreError::Queue(_) => StatusCode::CONFLICT,
            StoreError::BadSession(_) => StatusCode::BAD_REQUEST,
            StoreError::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if let StoreError::AssignedDifferently(session) = &self {
            // Said so a caller can tell it from a pod holding another session: this one is
            // here already, with what it was first given.
            let body = json!({"error": self.to_string(), "reason": ASSIGNED_DIFFERENTLY,
                              "session": session});
            return (status, Json(body)).into_response();
        }
        error(status, self.to_string())
    }
}

/// A blocking task that did not finish (it panicked, or the runtime is stopping).
pub fn task_failed(e: tokio::task::JoinError) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session assigned before with other content is a 409 that names it and says why, so
    /// the operator can tell its pod runs it from a pod that holds another session.
    #[tokio::test]
    async fn a_session_assigned_differently_is_named_in_its_conflict() {
        let response = StoreError::AssignedDifferently("j-t-0".into()).into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            (&body["reason"], &body["session"]),
            (&json!(ASSIGNED_DIFFERENTLY), &json!("j-t-0"))
        );
        assert!(body["error"]
            .as_str()
            .is_some_and(|e| e.contains("already assigned")));
    }
}
