//! The trajectory wire format: the checked-in JSON Schema matches the Rust types, and what the
//! builders produce validates against it.

use std::path::PathBuf;

use floe_gateway::capture::{Api, CompletionRecord};
use floe_gateway::trajectory::{
    build_trajectory, wire_schema, BuildOptions, Builder, Evaluation, SessionInfo, SessionOutcome,
};

fn schema_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/trajectory.schema.json")
}

#[test]
fn checked_in_schema_matches_the_types() {
    let expected = format!(
        "{}\n",
        serde_json::to_string_pretty(&wire_schema()).expect("json")
    );
    if std::env::var_os("FLOE_BLESS").is_some() {
        std::fs::write(schema_path(), &expected).expect("write schema");
    }
    let actual = std::fs::read_to_string(schema_path()).unwrap_or_default();
    assert!(
        actual == expected,
        "docs/trajectory.schema.json is stale: run scripts/generate.sh"
    );
}

fn record(seq: u64, prompt: Vec<u32>, response: Vec<u32>) -> CompletionRecord {
    CompletionRecord {
        session: "s".into(),
        api: Api::Anthropic,
        policy_version: Some(3),
        logprobs: Some(vec![-0.1; response.len()]),
        ..CompletionRecord::from_tokens(seq, prompt, response)
    }
}

#[test]
fn built_trajectories_validate_against_the_schema() {
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(schema_path()).expect("schema file"))
            .expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let records = vec![
        record(0, vec![1, 2], vec![5, 2]),
        record(1, vec![1, 2, 5, 2, 7], vec![6, 2]),
    ];
    let session = SessionInfo {
        session: "job-a-t1-0".into(),
        task: "t1".into(),
        group: "job-a/t1".into(),
        sample: 0,
        metadata: [("difficulty".to_string(), serde_json::json!("easy"))].into(),
    };
    let outcomes = [
        SessionOutcome::Completed {
            evaluation: Evaluation {
                reward: Some(1.0),
                passed: Some(true),
                detail: serde_json::json!({"tests": 3}),
            },
        },
        SessionOutcome::AgentTimeout {
            evaluation: None,
            reward: -1.0,
        },
        SessionOutcome::InfraError {
            message: "pod lost".into(),
        },
        SessionOutcome::Unscored,
    ];
    for builder in [Builder::PrefixMerging, Builder::PerRequest] {
        for outcome in &outcomes {
            let options = BuildOptions {
                builder,
                ..Default::default()
            };
            let t = build_trajectory(&session, &records, &options, outcome);
            let json = serde_json::to_value(&t).expect("json");
            let errors: Vec<String> = validator
                .iter_errors(&json)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{builder:?} {outcome:?}: {errors:?}");
        }
    }
    // And the schema does reject what a trainer must not accept.
    let good = serde_json::to_value(build_trajectory(
        &session,
        &records,
        &BuildOptions::default(),
        &outcomes[0],
    ))
    .expect("json");
    let mut bad_mask = good.clone();
    bad_mask["traces"][0]["loss_mask"][0] = serde_json::json!(2);
    let mut no_session = good.clone();
    no_session.as_object_mut().map(|m| m.remove("session"));
    let mut bad_status = good.clone();
    bad_status["status"] = serde_json::json!("finished");
    for bad in [bad_mask, no_session, bad_status] {
        assert!(!validator.is_valid(&bad), "schema accepted {bad}");
    }
}
