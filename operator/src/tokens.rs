//! The control tokens of the pods this operator created, kept in memory so that delivering an
//! assignment does not cost an apiserver round trip for the pod's Secret (after a restart the
//! Secret is read once and remembered).

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct ControlTokens(Mutex<HashMap<(String, String), String>>);

impl ControlTokens {
    pub fn remember(&self, namespace: &str, pod: &str, token: &str) {
        let mut m = floe_gateway::sync::lock(&self.0);
        m.insert((namespace.into(), pod.into()), token.into());
    }

    pub fn get(&self, namespace: &str, pod: &str) -> Option<String> {
        let m = floe_gateway::sync::lock(&self.0);
        m.get(&(namespace.to_string(), pod.to_string())).cloned()
    }

    pub fn forget(&self, namespace: &str, pod: &str) {
        let mut m = floe_gateway::sync::lock(&self.0);
        m.remove(&(namespace.to_string(), pod.to_string()));
    }
}
