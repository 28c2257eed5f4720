//! Kubernetes Events (`events.k8s.io/v1`) from the controllers: on transitions only, never once
//! per reconcile. A failure to publish is logged, never fails a reconcile.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

pub struct Events(Recorder);

impl Events {
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: "floe-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self(Recorder::new(client, reporter))
    }

    pub async fn publish(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.publish_as(on, type_, reason, "Reconcile", note).await;
    }

    /// With an `action` of its own: the recorder folds an Event into an earlier one of the same
    /// type, reason and action (a series, keeping the first note), so news that must each be
    /// read — one per held-out round — need distinct actions.
    pub async fn publish_as(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.0.publish(&ev, on).await {
            tracing::warn!(object = ?on.name, "cannot publish event {reason}: {e}");
        }
    }
}
