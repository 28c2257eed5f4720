//! floe's operator. Reconcile decisions are plain functions over plain data ([`pool::plan`],
//! [`rollout::plan`]), so every decision is unit-tested without a cluster; the controllers that
//! feed them from the apiserver and apply their plans live at the edges. Only what the `floe` binary uses is public;
//! read the rest with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub(crate) mod api_call;
pub(crate) mod claim_gate;
pub mod client_rate;
pub mod clients;
pub(crate) mod controller_ref;
pub(crate) mod egress_policy;
pub(crate) mod events;
pub mod leader;
pub mod lease_fence;
pub(crate) mod metrics;
/// A RolloutJob's session series, shared with `floe run --metrics-listen`.
pub use metrics::job_series;
pub(crate) mod pod_cache;
pub(crate) mod pod_problem;
pub(crate) mod pods;
pub(crate) mod pool;
pub mod rollout;
pub mod run;
pub(crate) mod served_crds;
pub(crate) mod shared;
pub(crate) mod spec_check;
pub mod stable_hash;
#[cfg(test)]
pub(crate) mod stand_in_apiserver;
pub(crate) mod tokens;

/// The condition types `docs/crds.md` lists for a kind (its `status.conditions` row: every
/// backticked word of the description), for tests that check them against the code.
#[cfg(test)]
pub(crate) fn documented_condition_types(kind: &str) -> std::collections::BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/crds.md");
    let doc = std::fs::read_to_string(path).expect("docs/crds.md");
    let section = doc
        .split(&format!("\n## {kind} "))
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the kind's section");
    let row = section
        .lines()
        .find(|l| l.starts_with("| `status.conditions`"))
        .expect("a status.conditions row");
    let description = row.split('|').nth(5).expect("a description column");
    description
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|w| w.split('/'))
        .map(str::to_string)
        .collect()
}
