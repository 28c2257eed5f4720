//! The checked-in generated files must match the Rust types. Regenerate with
//! `scripts/generate.sh` (which runs this test with `FLOE_BLESS=1`).

use std::path::{Path, PathBuf};

use floe_crds::generate::{crds_yaml, Target};
use floe_crds::reference::reference_markdown;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn check(relative: &str, expected: &str) {
    let path = root().join(relative);
    if std::env::var_os("FLOE_BLESS").is_some() {
        std::fs::write(&path, expected).expect("write generated file");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{relative} is out of date with the Rust types; run scripts/generate.sh and commit the result"
    );
}

/// examples/*.yaml, then docs/crd-reference-values.yaml.
fn examples() -> Vec<serde_json::Value> {
    let mut paths: Vec<_> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    // Then the values for fields the examples leave out (status included).
    paths.push(root().join("docs/crd-reference-values.yaml"));
    let mut docs = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).expect("read");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            docs.push(serde::Deserialize::deserialize(doc).expect("yaml"));
        }
    }
    docs
}

#[test]
fn reference_values_are_valid_objects() {
    for doc in examples() {
        match doc["kind"].as_str() {
            Some("GatewayPool") => {
                let pool: floe_crds::GatewayPool =
                    serde_json::from_value(doc).expect("GatewayPool");
                floe_crds::validation::validate_gateway_pool(&pool).expect("valid pool");
            }
            Some("RolloutJob") => {
                let job: floe_crds::RolloutJob = serde_json::from_value(doc).expect("RolloutJob");
                floe_crds::validation::validate_rollout_job(&job).expect("valid job");
            }
            other => panic!("unexpected kind {other:?}"),
        }
    }
}

/// The chart ships both renderings and picks one by the cluster's version.
#[test]
fn chart_crds_match_the_types() {
    check(
        "charts/floe/files/crds/floe-crds.yaml",
        &crds_yaml(Target::LATEST).expect("yaml"),
    );
    let pre_cel = Target::for_kube_version("1.24").expect("version");
    check(
        "charts/floe/files/crds/floe-crds-pre-1.25.yaml",
        &crds_yaml(pre_cel).expect("yaml"),
    );
}

#[test]
fn crd_reference_matches_the_types() {
    check(
        "docs/crds.md",
        &reference_markdown(&examples()).expect("reference"),
    );
}

#[test]
fn every_field_has_a_description_and_an_example() {
    let gaps = floe_crds::reference::undocumented_fields(&examples()).expect("reference");
    assert!(
        gaps.is_empty(),
        "fields missing docs or an example:\n{}",
        gaps.join("\n")
    );
}
