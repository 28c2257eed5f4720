//! `train.fidelityCheck` in `floe run`: the last thing a train run's start does, once the
//! policy server and the trainer answer ([`floe_sandbox::fidelity`]).

use floe_sandbox::fidelity;

use super::super::plan::Plan;
use super::super::RunError;
use super::Training;

impl Training {
    /// Before the first session: does the trainer model what the policy server samples
    /// (`train.fidelityCheck`, [`floe_sandbox::fidelity`])? `Err` with the line that stops
    /// the run.
    pub(super) async fn check_fidelity(&self, plan: &Plan) -> Result<(), RunError> {
        let Some(train) = &plan.job.spec.train else {
            return Ok(());
        };
        let check = &train.fidelity_check;
        if check.action == floe_crds::rollout_job::FidelityAction::Off {
            return Ok(());
        }
        let Some(token) = &self.control_token else {
            eprintln!(
                "[train] fidelity check skipped: the trainer is not this run's (--trainer-url)"
            );
            return Ok(());
        };
        // A session's own upstream settings: its sampling is what the probes sample with.
        let Some(first) =
            super::super::plan::assignment(plan, &floe_gateway::ship::Sink::None, 0, 0)
        else {
            return Ok(());
        };
        let upstream = first.upstream.unwrap_or_default();
        let instructions = plan.tasks.iter().map(|t| t.instruction.as_str());
        let probe = fidelity::Probe {
            http: &self.http,
            policy_url: &self.policy_url,
            policy_key: None,
            model: &self.model_name,
            trainer_url: &self.trainer_url,
            control_token: token,
            upstream: &upstream,
            prompts: fidelity::prompts(instructions, usize::try_from(check.samples).unwrap_or(1)),
        };
        let measured = match fidelity::measure(&probe).await {
            Ok(m) => m,
            Err(e @ fidelity::FidelityError::Unsupported(_)) => {
                eprintln!("[train] fidelity check skipped: {e}");
                return Ok(());
            }
            Err(e) => return Err(RunError::Preflight(format!("fidelity check: {e}"))),
        };
        match fidelity::verdict(check, &measured) {
            Ok(line) => {
                eprintln!("[train] {line}");
                Ok(())
            }
            Err(line) => Err(RunError::Preflight(line)),
        }
    }
}
