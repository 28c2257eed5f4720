//! What the gateway makes of its trajectories' shipping ([`crate::ship::shipper`]): counted in
//! its metrics, and the last failure remembered for the session's status.

use std::collections::HashSet;
use std::sync::Mutex;

use super::Gateway;
use crate::ship::shipper::{Shipped, Shipping};
use crate::ship::Spool;
use crate::sync::lock;

impl Shipping for Gateway {
    fn client(&self) -> &reqwest::Client {
        &self.http
    }

    fn spool(&self) -> &Spool {
        &self.spool
    }

    fn in_flight(&self) -> &Mutex<HashSet<String>> {
        &self.shipping
    }

    fn report(&self, session: &str, event: Shipped<'_>) {
        let m = &self.metrics;
        match event {
            Shipped::Started => m.shipping(true),
            Shipped::Accepted { target } => {
                lock(&self.delivery_errors).remove(session);
                tracing::info!(%session, %target, "trajectory shipped");
                m.trajectory("shipped");
            }
            Shipped::Refused { reason } => {
                tracing::error!(%session, %reason, "sink refused the trajectory; kept in the spool's rejected/");
                lock(&self.delivery_errors).insert(session.to_string(), reason.to_string());
                m.trajectory("rejected");
            }
            Shipped::Failed { failure, retry_in } => {
                tracing::warn!(%session, kind = %failure.kind, reason = %failure.message, ?retry_in, "delivery failed");
                m.delivery_error(&failure.kind);
                lock(&self.delivery_errors).insert(session.to_string(), failure.message.clone());
                m.trajectory("retried");
            }
            Shipped::Ended => m.shipping(false),
        }
    }
}

impl Gateway {
    /// The last failed delivery of a session whose trajectory is not shipped.
    pub fn delivery_error(&self, session: &str) -> Option<String> {
        lock(&self.delivery_errors).get(session).cloned()
    }
}
