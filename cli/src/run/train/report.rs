//! What `floe run` says of its trainer: a line per optimizer step, `summary.json`'s
//! `training`, and how busy the run kept the policy server and the trainer.

use serde_json::Value;

/// The sum of vLLM's `vllm:num_requests_running` series in a Prometheus text page.
pub fn requests_running(metrics: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with("vllm:num_requests_running"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// How busy the run kept the policy server and the trainer, over `wall_seconds` (this run's:
/// a resumed run's step table holds the earlier run's steps too, which are not counted).
pub fn utilization(busy: Option<f64>, status: &Value, wall_seconds: f64) -> Value {
    let steps = status["steps"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let resumed = status["resumedFromStep"].as_u64().unwrap_or(0);
    let working: f64 = steps
        .iter()
        .filter(|s| s["step"].as_u64().is_none_or(|n| n > resumed))
        .map(|s| {
            s["trainSeconds"].as_f64().unwrap_or(0.0) + s["pushSeconds"].as_f64().unwrap_or(0.0)
        })
        .sum();
    serde_json::json!({
        "policyServerBusyFraction": busy,
        "trainerIdleFraction": (wall_seconds > 0.0).then(|| (1.0 - working / wall_seconds).max(0.0)),
    })
}

/// `summary.json`'s `training`: what the trainer did, from its last status.
pub fn summary(status: &Value, curve_file: &str) -> Value {
    serde_json::json!({
        "steps": status["steps"],
        "sampled": status["sampled"],
        "policyVersion": status["policyVersion"],
        "finished": status["finished"],
        "finalModel": status["finalCheckpoint"],
        "dropped": status["dropped"],
        "versionLag": status["versionLag"],
        "repushes": status["repushes"],
        "ingest": status["ingest"],
        "rewardCurve": curve_file,
    })
}

/// One progress line per optimizer step.
pub fn step_line(s: &Value) -> String {
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    // Tokens the step's passes computed per token of its traces: above 1 is padding, below 1
    // what prompt sharing saved (a trainer before it reports neither).
    let computed = match (s["computedTokens"].as_f64(), s["traceTokens"].as_f64()) {
        (Some(c), Some(t)) if t > 0.0 => format!(" (computed {:.2}×)", c / t),
        _ => String::new(),
    };
    // Sessions with a call cut at its token cap: said only when there are some.
    let overlong = match (s["overlongSessions"].as_u64(), s["maskedSessions"].as_u64()) {
        (Some(n), Some(m)) if m > 0 => format!(" · {n} overlong ({m} masked)"),
        (Some(n), _) if n > 0 => format!(" · {n} overlong"),
        _ => String::new(),
    };
    // Sessions whose advantage a `grpo.overlongPenalty` lowered: said only when there are some.
    let penalized = match (
        s["penalizedSessions"].as_u64(),
        s["overlongPenalty"].as_f64(),
    ) {
        (Some(n), Some(mean)) if n > 0 => format!(" · {n} penalized (mean {mean:.3})"),
        _ => String::new(),
    };
    format!(
        "[train] step {} · policy v{} · {} groups · reward {:.3} · pass {:.0}% · {} tokens{}{}{} · clip {:.3} · lag ≤{} · {} stale · train {:.1} s · push {:.1} s",
        s["step"],
        s["policyVersion"],
        s["groups"],
        f("rewardMean"),
        100.0 * f("passRate"),
        s["tokens"],
        computed,
        overlong,
        penalized,
        f("clipFraction"),
        s["versionLagMax"],
        s["staleDrops"],
        f("trainSeconds"),
        f("pushSeconds"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_step_line_says_what_the_passes_computed_per_trace_token() {
        let step = json!({"step": 3, "policyVersion": 3, "groups": 2, "tokens": 120,
            "computedTokens": 420, "traceTokens": 1000});
        assert!(step_line(&step).contains("120 tokens (computed 0.42×) · clip"));
        // A trainer that does not report them: the line as before.
        let older = json!({"step": 3, "policyVersion": 3, "groups": 2, "tokens": 120});
        assert!(step_line(&older).contains("120 tokens · clip"));
    }

    #[test]
    fn a_step_line_names_its_overlong_sessions_only_when_there_are_some() {
        let step = |o: u64, m: u64| {
            step_line(&json!({"tokens": 9, "overlongSessions": o, "maskedSessions": m}))
        };
        assert!(step(0, 0).contains("9 tokens · clip"));
        assert!(step(2, 0).contains("9 tokens · 2 overlong · clip"));
        assert!(step(2, 2).contains("9 tokens · 2 overlong (2 masked) · clip"));
        let penalized = |n: u64| {
            step_line(
                &json!({"tokens": 9, "overlongSessions": 1, "maskedSessions": 0,
                              "penalizedSessions": n, "overlongPenalty": 0.25}),
            )
        };
        assert!(penalized(0).contains("9 tokens · 1 overlong · clip"));
        assert!(penalized(3).contains("9 tokens · 1 overlong · 3 penalized (mean 0.250) · clip"));
    }

    #[test]
    fn requests_running_sums_vllms_gauge_over_engines() {
        let page = "# HELP x\nvllm:num_requests_running{engine=\"0\"} 2.0\nvllm:num_requests_running{engine=\"1\"} 1.0\nvllm:num_requests_waiting{engine=\"0\"} 5.0\n";
        assert_eq!(requests_running(page), Some(3.0));
        assert_eq!(requests_running("other 1"), None);
        let status = json!({"steps": [{"trainSeconds": 3.0, "pushSeconds": 1.0}]});
        let u = utilization(Some(0.5), &status, 10.0);
        assert_eq!(u["trainerIdleFraction"], 0.6);
        assert_eq!(u["policyServerBusyFraction"], 0.5);
    }

    #[test]
    fn a_resumed_runs_idle_fraction_counts_its_own_steps_only() {
        let step = |n: u64| json!({"step": n, "trainSeconds": 40.0, "pushSeconds": 10.0});
        // Steps 1-4 ran before the resume (200 s of work), step 5 in this 100 s run.
        let status = json!({"resumedFromStep": 4,
            "steps": [step(1), step(2), step(3), step(4), step(5)]});
        assert_eq!(
            utilization(None, &status, 100.0)["trainerIdleFraction"],
            0.5
        );
    }
}
