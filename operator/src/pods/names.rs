//! Every name floe writes on the objects it makes: labels, annotations, finalizers, container
//! names and Secret keys. They live in users' clusters (and in NetworkPolicies, dashboards and
//! scripts that select on them), so a change here is a migration, not a rename.

/// The pool a sandbox pod was made for.
pub const POOL_LABEL: &str = "floe.dev/pool";
/// On every sandbox pod, a pool's or a `poolTemplate` job's own: what NetworkPolicies select.
pub const SANDBOX_LABEL: &str = "floe.dev/sandbox";
/// Where a sandbox pod is in its life ([`super::PodState`]).
pub const STATE_LABEL: &str = "floe.dev/state";
/// The job a claimed (or `poolTemplate`) pod runs a session of.
pub const JOB_LABEL: &str = "floe.dev/job";

/// The pool template a pod was made from (`updateStrategy` compares it).
pub const TEMPLATE_HASH_ANNOTATION: &str = "floe.dev/template-hash";
/// On a sandbox pod: the grader's `ephemeral-storage` limit, floe's room beside the agent's
/// disk backstop (`pods::sandbox`).
pub const GRADER_ROOM_ANNOTATION: &str = "floe.dev/grader-disk-room";
/// The session index a claimed pod holds.
pub const INDEX_ANNOTATION: &str = "floe.dev/session-index";
/// The attempt of that session (its infrastructure retries so far).
pub const ATTEMPT_ANNOTATION: &str = "floe.dev/attempt";
/// The session id.
pub const SESSION_ANNOTATION: &str = "floe.dev/session";
/// Set once the pod's gateway acknowledged the assignment.
pub const ASSIGNED_ANNOTATION: &str = "floe.dev/assigned";
/// When the pod was claimed.
pub const CLAIMED_AT_ANNOTATION: &str = "floe.dev/claimed-at";
/// Set by the operator once it saw the pod's agent container ended while the pod ran: the
/// kubelet's status of a pod it evicted may keep no container statuses (Kubernetes 1.20's
/// keeps none), and an eviction for the grader's own disk is the agent's doing only if the
/// agent had ended before it.
pub const AGENT_ENDED_ANNOTATION: &str = "floe.dev/agent-ended";

/// On a claimed pod: keeps it until its result is folded into the job's status.
pub const SESSION_FINALIZER: &str = "floe.dev/session";
/// On a RolloutJob: keeps it until its pods' finalizers are removed. (One letter from
/// [`SESSION_FINALIZER`], on another kind; both are in live objects, so both stay.)
pub const JOB_FINALIZER: &str = "floe.dev/sessions";

/// The container `floe sandbox` runs in: prepare steps, the assignment, the evaluator; its
/// termination message is the session's result.
pub const GRADER_CONTAINER: &str = "sandbox";
/// The container the harness runs in (`floe agent`).
pub const AGENT_CONTAINER: &str = "agent";
/// A SWE-bench pod's evaluation copy, mounted at `/testbed` in the grader (`pods::swebench`).
pub const EVAL_VOLUME: &str = "floe-eval";
/// The volumes only the agent fills, sized by its disk budget: its workspace and its home, and
/// a SWE-bench pod's evaluation copy (its workspace copied, then what its code writes there
/// while the tests run; the untouched repository's copy, run first, is cleared before it).
/// An eviction for one of them is the agent's doing.
pub const AGENT_VOLUMES: &[&str] = &["floe-workspace", "floe-agent", EVAL_VOLUME];

/// Key of the control token in the per-pod Secret.
pub const CONTROL_TOKEN_KEY: &str = "control-token";

/// On a job's own pods (trainer, collector, task loader): which one it is. Not
/// [`JOB_LABEL`], which marks sessions.
pub const ROLE_LABEL: &str = "floe.dev/job-role";
/// On a job's own pods: the job they belong to.
pub const OWNER_JOB_LABEL: &str = "floe.dev/owner-job";

/// Tells a sandbox pod's grader to check its egress at start, and what to do when it is open:
/// `warn` or `refuse` (`floe sandbox --egress-check`).
pub const EGRESS_CHECK_ENV: &str = "FLOE_EGRESS_CHECK";

/// Tells a sandbox pod's grader the agent's disk budget (`floe sandbox --disk-budget`, from the
/// template's `diskBudget`).
pub const DISK_BUDGET_ENV: &str = "FLOE_DISK_BUDGET";

/// The policy Service's port: `floe policy-proxy` in a train job's trainer pod, in front of
/// vLLM. Sandbox pods' egress policy opens it.
pub const VLLM_PORT: i32 = 8000;
/// Trajectory ingest (trainer or dataset collector, `POST /v1/trajectories`) and the task
/// loader's `/tasks`. Sandbox pods' egress policy opens it.
pub const INGEST_PORT: i32 = 8100;
