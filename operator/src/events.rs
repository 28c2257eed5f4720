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

    /// The recorder folds an Event into an earlier one of the same type, reason and action
    /// within minutes, keeping the first note: two sessions failed at once read as one
    /// `SessionFailed` (x2) naming only the first. So the action carries a digest of the note:
    /// the same news again is still a series, other news an Event of its own.
    pub async fn publish(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let action = action_of(&note);
        self.publish_as(on, type_, reason, &action, note).await;
    }

    /// With an `action` of its own: the recorder folds an Event into an earlier one of the same
    /// type, reason and action (a series, keeping the first note), so news that must each be
    /// read need distinct actions (one per held-out round).
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

/// `Reconcile-<digest of note>` ([`crate::stable_hash::fnv1a_hex`]): short, and the same for
/// the same note on every replica.
fn action_of(note: &str) -> String {
    format!("Reconcile-{}", crate::stable_hash::fnv1a_hex(note))
}

#[cfg(test)]
mod tests {
    use super::action_of;

    #[test]
    fn the_same_note_has_the_same_action_and_another_note_another() {
        let a = action_of("evict-a-0 (pod p1) failed: evicted");
        assert_eq!(a, action_of("evict-a-0 (pod p1) failed: evicted"));
        assert_ne!(a, action_of("evict-b-0 (pod p2) failed: evicted"));
        assert!(a.starts_with("Reconcile-") && a.len() <= 128, "{a}");
    }
}
