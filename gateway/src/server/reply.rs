//! The control API's answers: JSON `{"error": ...}` with a status, and the status each kind of
//! refusal gets.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::session_store::StoreError;

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
        error(status, self.to_string())
    }
}

/// A blocking task that did not finish (it panicked, or the runtime is stopping).
pub fn task_failed(e: tokio::task::JoinError) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}
