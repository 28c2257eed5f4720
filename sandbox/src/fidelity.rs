//! A train run's fidelity check, before its first session: does the trainer model the
//! distribution the policy server samples? A few completions are sampled with exactly the
//! requests a session's gateway makes (the assignment's [`UpstreamOverride`] applied by
//! [`UpstreamOverride::apply_to`], the request finalized by the gateway's own
//! [`finalize_request`], the answer read by its [`read_answer`]), and their tokens and vLLM's
//! log-probs go to the trainer (`POST /v1/fidelity`), which scores them under its policy at
//! the job's temperature. The mean absolute difference per token is the figure every step
//! reports as `logprobMismatch`; `train.fidelityCheck` says how much is too much.

use std::time::Duration;

use floe_crds::rollout_job::{FidelityAction, FidelityCheckSpec};
use floe_gateway::protocol::answer::read_answer;
use floe_gateway::protocol::upstream::{finalize_request, CallLimits};
use floe_gateway::ship::UpstreamOverride;
use serde_json::{json, Value};

/// Tokens sampled per probe completion (enough to see a sampling default, cheap on a CPU).
pub const PROBE_TOKENS: u32 = 32;
/// The longest a probe may take.
const PROBE_DEADLINE: Duration = Duration::from_secs(120);
/// Characters of a task's instruction a probe prompt keeps.
const PROMPT_CHARS: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    #[error("sampling a probe from the policy server: {0}")]
    Sample(String),
    #[error("the trainer's fidelity check: {0}")]
    Trainer(String),
    /// The trainer cannot make the check (one over several processes): not a verdict.
    #[error("the trainer does not make the fidelity check: {0}")]
    Unsupported(String),
}

/// What the trainer answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub samples: usize,
    pub tokens: u64,
    /// Mean |trainer − vLLM| log-prob per sampled token, nats.
    pub mismatch: f64,
    pub max: f64,
}

/// Where to sample and where to score.
pub struct Probe<'a> {
    pub http: &'a reqwest::Client,
    /// The policy server's base URL (without `/v1`), its key, and the model name a session's
    /// gateway sends it when the assignment names none.
    pub policy_url: &'a str,
    pub policy_key: Option<&'a str>,
    pub model: &'a str,
    /// The trainer's ingest base URL and its control token.
    pub trainer_url: &'a str,
    pub control_token: &'a str,
    /// A session's upstream settings (the job's assignment).
    pub upstream: &'a UpstreamOverride,
    /// One user message each (the job's first tasks' instructions).
    pub prompts: Vec<String>,
}

/// The probe prompts: the first `samples` tasks' instructions (cycled), cut to a size a
/// probe needs.
pub fn prompts<'a>(
    instructions: impl Iterator<Item = &'a str> + Clone,
    samples: usize,
) -> Vec<String> {
    instructions
        .cycle()
        .take(samples)
        .map(|i| i.chars().take(PROMPT_CHARS).collect())
        .collect()
}

/// Sample the probes and have the trainer score them.
pub async fn measure(p: &Probe<'_>) -> Result<Measured, FidelityError> {
    let mut limits = CallLimits {
        kind: Default::default(),
        upstream_model: p.model.to_string(),
        max_response_tokens: PROBE_TOKENS,
        temperature: None,
        top_p: None,
        caller_sampling: Default::default(),
        call_deadline: Duration::from_secs(300),
        hosted_tools: Default::default(),
        retry: Default::default(),
        session_budget: Default::default(),
    };
    p.upstream.apply_to(&mut limits);
    limits.max_response_tokens = limits.max_response_tokens.min(PROBE_TOKENS);
    // A probe of 32 tokens: a server that takes longer is not answering (the operator's
    // round waits on it).
    limits.call_deadline = limits.call_deadline.min(PROBE_DEADLINE);
    let mut traces = Vec::new();
    for prompt in &p.prompts {
        let mut body = serde_json::Map::new();
        body.insert(
            "messages".into(),
            json!([{"role": "user", "content": prompt}]),
        );
        let finalized =
            finalize_request(body, &limits).map_err(|e| FidelityError::Sample(e.to_string()))?;
        let url = format!("{}/v1/chat/completions", p.policy_url.trim_end_matches('/'));
        let mut request = p
            .http
            .post(&url)
            .json(&finalized.request)
            .timeout(limits.call_deadline);
        if let Some(key) = p.policy_key {
            request = request.bearer_auth(key);
        }
        let reply = request
            .send()
            .await
            .map_err(|e| FidelityError::Sample(format!("POST {url}: {e}")))?;
        let status = reply.status();
        let text = reply
            .text()
            .await
            .map_err(|e| FidelityError::Sample(format!("POST {url}: {e}")))?;
        if !status.is_success() {
            return Err(FidelityError::Sample(format!(
                "POST {url}: {status}: {}",
                text.chars().take(300).collect::<String>()
            )));
        }
        let sampled = read_answer(&text, limits.kind, false)
            .map_err(|e| FidelityError::Sample(e.to_string()))?
            .sampled;
        let logprobs = sampled
            .logprobs
            .ok_or_else(|| FidelityError::Sample("the answer carries no logprobs".into()))?;
        if sampled.token_ids.is_empty() {
            continue; // an immediate end of sequence: nothing to score
        }
        traces.push(json!({
            "prompt_token_ids": sampled.prompt_token_ids,
            "response_token_ids": sampled.token_ids,
            "logprobs": logprobs,
        }));
    }
    if traces.is_empty() {
        return Err(FidelityError::Sample(
            "every probe ended before its first token".into(),
        ));
    }
    let url = format!("{}/v1/fidelity", p.trainer_url.trim_end_matches('/'));
    let reply = p
        .http
        .post(&url)
        .bearer_auth(p.control_token)
        .json(&json!({"traces": traces}))
        .timeout(PROBE_DEADLINE)
        .send()
        .await
        .map_err(|e| FidelityError::Trainer(format!("POST {url}: {e}")))?;
    let status = reply.status();
    let answer: Value = reply
        .json()
        .await
        .map_err(|e| FidelityError::Trainer(format!("POST {url}: {e}")))?;
    let said = answer["error"].as_str().unwrap_or_default().to_string();
    if status == reqwest::StatusCode::NOT_IMPLEMENTED {
        return Err(FidelityError::Unsupported(said));
    }
    if !status.is_success() {
        return Err(FidelityError::Trainer(format!(
            "POST {url}: {status}: {said}"
        )));
    }
    Ok(Measured {
        samples: traces.len(),
        tokens: answer["tokens"].as_u64().unwrap_or(0),
        mismatch: answer["mismatch"].as_f64().unwrap_or(f64::NAN),
        max: answer["max"].as_f64().unwrap_or(f64::NAN),
    })
}

/// What the run does with a measurement: `Err` with the one line that stops it.
pub fn verdict(spec: &FidelityCheckSpec, m: &Measured) -> Result<String, String> {
    let line = format!(
        "fidelity check: the trainer's log-probs of {} tokens sampled by the policy server are \
         {} nats apart on average (at most {}; train.fidelityCheck.maxMismatch {})",
        m.tokens,
        nats(m.mismatch),
        nats(m.max),
        spec.max_mismatch
    );
    // NaN (an answer without the figure) fails the comparison: never a pass.
    if m.mismatch <= spec.max_mismatch {
        return Ok(line);
    }
    let why = format!(
        "{line}: the trainer would train a distribution vLLM does not sample. Check the model's \
         generation_config.json sampling defaults, that vLLM and the trainer load the same \
         weights, tokenizer and dtype; or set train.fidelityCheck.action: Warn"
    );
    match spec.action {
        FidelityAction::Fail => Err(why),
        FidelityAction::Warn | FidelityAction::Off => Ok(why),
    }
}

/// `0.4000`, or `1.2e-5` below a thousandth (a healthy figure, which four decimals show as 0).
fn nats(x: f64) -> String {
    if x.abs() < 1e-3 && x != 0.0 {
        format!("{x:.1e}")
    } else {
        format!("{x:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(mismatch: f64) -> Measured {
        Measured {
            samples: 4,
            tokens: 128,
            mismatch,
            max: mismatch * 3.0,
        }
    }

    #[test]
    fn within_the_tolerance_passes_beyond_it_fails_or_warns() {
        let spec = FidelityCheckSpec::default();
        let passed = verdict(&spec, &measured(1.2e-5)).unwrap_or_default();
        assert!(passed.contains("1.2e-5 nats apart"), "{passed}");
        let failed = verdict(&spec, &measured(0.40)).err().unwrap_or_default();
        assert!(failed.contains("0.4000 nats apart"), "{failed}");
        assert!(failed.contains("generation_config.json"), "{failed}");
        assert!(
            verdict(&spec, &measured(f64::NAN)).is_err(),
            "no figure is no pass"
        );
        let warn = FidelityCheckSpec {
            action: FidelityAction::Warn,
            ..spec
        };
        let warned = verdict(&warn, &measured(0.40));
        assert!(warned.is_ok_and(|line| line.contains("would train a distribution")));
    }

    #[test]
    fn probe_prompts_cycle_the_first_tasks_and_are_cut() {
        let long = "x".repeat(5000);
        let p = prompts(["a", long.as_str()].into_iter(), 3);
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].as_str(), p[1].len(), p[2].as_str()), ("a", 2000, "a"));
    }
}
