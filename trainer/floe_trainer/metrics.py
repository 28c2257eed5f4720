"""The trainer's Prometheus metrics (``/metrics``), ``floe_trainer_*``. GPU utilization comes
from NVML (``nvidia-ml-py``) when a GPU is there; on CPU the GPU series are absent, not 0."""

from __future__ import annotations

import threading
from collections import Counter

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PCounter
from prometheus_client.core import CounterMetricFamily

from .step import StepStats

LAG_BUCKETS = (0, 1, 2, 3, 4, 8, 16, 32)
STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.step_g = Gauge("floe_trainer_step", "Optimizer steps taken", registry=r)
        # The alerts on an idle or stalled trainer leave a finished one alone: a train job's
        # final held-out round runs sessions after it (its GPUs idle by design).
        self.finished = Gauge(
            "floe_trainer_finished",
            "1 once the trainer trained everything and wrote its final model",
            registry=r,
        )
        self.version = Gauge(
            "floe_trainer_policy_version",
            "The trainer's policy version (its last step's weights)",
            registry=r,
        )
        self.served_version = Gauge(
            "floe_trainer_served_policy_version",
            "The policy version vLLM said it serves at the trainer's last look (-1: a label"
            " not floe's); below floe_trainer_policy_version, a push has not reached it",
            registry=r,
        )
        self.replay_unreadable = Gauge(
            "floe_trainer_replay_unreadable",
            "Stored trajectories this trainer's start could not replay (sessions lost)",
            registry=r,
        )
        self.loss = Gauge("floe_trainer_loss", "Policy loss of the last step", registry=r)
        self.reward = Gauge(
            "floe_trainer_reward_mean", "Mean reward of the last step's groups", registry=r
        )
        self.pass_rate = Gauge(
            "floe_trainer_pass_rate", "Pass rate of the last step's groups", registry=r
        )
        self.clip = Gauge("floe_trainer_clip_fraction", "Fraction of tokens clipped", registry=r)
        self.clip_side = Gauge(
            "floe_trainer_clip_fraction_by_side",
            "Fraction of tokens clipped: high (ratio above 1 + epsilonHigh, positive "
            "advantage), low (below 1 - epsilonLow, negative advantage) or dual (above "
            "dualClip, negative advantage)",
            ["side"],
            registry=r,
        )
        self.tis_truncated = Gauge(
            "floe_trainer_tis_truncated_fraction",
            "Fraction of tokens whose importance weight was truncated at tisCap",
            registry=r,
        )
        self.behaviour_unknown = Gauge(
            "floe_trainer_behaviour_unknown_fraction",
            "Fraction of the last step's trained tokens the sampler gave no log-prob for (no "
            "importance weight; the TIS and mismatch figures are of the others)",
            registry=r,
        )
        self.entropy = Gauge(
            "floe_trainer_policy_entropy",
            "Mean entropy (nats) of the policy over the last step's sampled tokens' positions",
            registry=r,
        )
        self.advantage_std = Gauge(
            "floe_trainer_advantage_std", "Std of the last step's advantages", registry=r
        )
        self.response_tokens = Gauge(
            "floe_trainer_response_tokens",
            "Sampled tokens per trace in the last step: mean and max",
            ["stat"],
            registry=r,
        )
        self.computed_tokens = Gauge(
            "floe_trainer_computed_token_ratio",
            "Tokens the last step's passes computed (padding included) per token of its traces: "
            "above 1 is padding, below 1 prompt sharing",
            registry=r,
        )
        # Every labelled series exists from the start (0 until the first step).
        for side in ("high", "low", "dual"):
            self.clip_side.labels(side)
        for stat in ("mean", "max"):
            self.response_tokens.labels(stat)
        self.tis_mean = Gauge("floe_trainer_tis_ratio_mean", "Mean truncated IS weight", registry=r)
        self.tis_ess = Gauge(
            "floe_trainer_tis_ess", "Effective sample size of the IS weights (0-1)", registry=r
        )
        self.mismatch = Gauge(
            "floe_trainer_logprob_mismatch",
            "Mean |trainer - vLLM| logprob on sampled tokens",
            registry=r,
        )
        self.kl = Gauge(
            "floe_trainer_kl_mean",
            "Mean per-token KL estimate to the reference policy (0 without klCoef)",
            registry=r,
        )
        self.grad_norm = Gauge(
            "floe_trainer_grad_norm", "Gradient norm before clipping", registry=r
        )
        self.skipped_updates = PCounter(
            "floe_trainer_skipped_updates",
            "Optimizer updates skipped: their gradient norm was not finite",
            registry=r,
        )
        self.sampled_sessions = PCounter(
            "floe_trainer_sampled_sessions",
            "Scored sessions received, whatever became of their group (trained or dropped)",
            registry=r,
        )
        # Rewards may be negative, and a counter only grows: the sum is two counters, so
        # that increase() sees a trainer's restart as a reset (a gauge's delta() read it as a
        # fall). (increase(positive[w]) - increase(negative[w])) / increase(sessions[w]) is
        # the mean reward of the sessions received in w.
        self.sampled_reward_positive = PCounter(
            "floe_trainer_sampled_reward_positive",
            "Sum of the positive rewards of the scored sessions received",
            registry=r,
        )
        self.sampled_reward_negative = PCounter(
            "floe_trainer_sampled_reward_negative",
            "Sum of the negative rewards' magnitudes of the scored sessions received",
            registry=r,
        )
        self.sampled_overlong = PCounter(
            "floe_trainer_sampled_overlong_sessions",
            "Scored sessions received with a call cut at its token cap (with"
            " sampled_sessions_total: how often the policy runs over)",
            registry=r,
        )
        self.overlong = Gauge(
            "floe_trainer_overlong_fraction",
            "Fraction of the last step's sessions with a call cut at its token cap (masked from"
            " the loss under grpo.overlong: Mask)",
            registry=r,
        )
        self.overlong_penalty = Gauge(
            "floe_trainer_overlong_penalty_mean",
            "Mean overlong penalty (grpo.overlongPenalty) the last step's sessions' advantages"
            " were taken with",
            registry=r,
        )
        self.agent_faults = PCounter(
            "floe_trainer_agent_fault_sessions",
            "Sessions failed by their agent's own doing (a pod evicted for what it wrote) and"
            " trained as a loss from their last snapshot",
            registry=r,
        )
        self.sampled_passed = PCounter(
            "floe_trainer_sampled_passed",
            "Scored sessions received that passed",
            registry=r,
        )
        self.tokens = PCounter("floe_trainer_tokens", "Trained tokens", registry=r)
        self.tokens_per_s = Gauge(
            "floe_trainer_tokens_per_second", "Trained tokens per second of training", registry=r
        )
        self.phase = Histogram(
            "floe_trainer_step_phase_seconds",
            "Step time by phase: wait (for data), train, sync (weights to vLLM)",
            ["phase"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        # The batcher's tallies (restored from the checkpoint).
        self._dropped = _Tallies(
            "floe_trainer_dropped",
            "Trajectories (untrainable, duplicate_sample, stale, late, failed, out_of_vocabulary)"
            " or groups"
            " (zero_advantage, incomplete, overlong, no_update) dropped",
            "reason",
            {reason: reason for reason in REASONS},
        )
        r.register(self._dropped)
        # The ingest's own counts (they start again at 0 with the process, which Prometheus
        # reads as a counter reset). ``invalid`` and ``agent_fault_unscored`` are sessions whose
        # learning signal was lost here (``FloeTrainerSessionsLost``).
        self._ingest = _Tallies(
            "floe_trainer_ingest",
            "Posts to the trainer's ingest by result: trajectories accepted, duplicate or"
            " invalid (refused, lost); snapshots kept whole (partial) or as deltas"
            " (partial_delta); sessions ruled failed by their agent scored 0 from their"
            " snapshot (agent_fault) or with no snapshot to score (agent_fault_unscored, lost)",
            "result",
            INGEST_RESULTS,
        )
        r.register(self._ingest)
        self.groups_trained = PCounter(
            "floe_trainer_groups_trained", "Groups that went into optimizer steps", registry=r
        )
        self.repushes = PCounter(
            "floe_trainer_vllm_repushes",
            "Pushes of the current weights to a vLLM found serving others (restarted)",
            registry=r,
        )
        self.version_lag = Histogram(
            "floe_trainer_version_lag",
            "Policy versions between a trained trajectory's oldest completion and the weights"
            " it trained",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.lag_counts: Counter[int] = Counter()
        self.gpu = Gauge(
            "floe_trainer_gpu_utilization", "GPU utilization percent (NVML)", ["gpu"], registry=r
        )
        self._nvml = _nvml()
        # Each phase's series from the start: the first step's times count in rate().
        for phase in ("wait", "train", "sync"):
            self.phase.labels(phase)

    def progress(self, step: int, version: int) -> None:
        self.step_g.set(step)
        self.version.set(version)

    def lags(self, lags: list[int]) -> None:
        for lag in lags:
            self.version_lag.observe(lag)
            self.lag_counts[lag] += 1

    def sampled(self, reward: float, passed: bool, overlong: bool = False) -> None:
        self.sampled_sessions.inc()
        if reward > 0:
            self.sampled_reward_positive.inc(reward)
        elif reward < 0:
            self.sampled_reward_negative.inc(-reward)
        if passed:
            self.sampled_passed.inc()
        if overlong:
            self.sampled_overlong.inc()

    def dropped(self, counts: Counter) -> None:
        self._dropped.counts = Counter(counts)

    def step(self, s: StepStats, pass_rate: float, wait: float, train: float, sync: float) -> None:
        self.loss.set(s.loss)
        self.reward.set(s.reward_mean)
        self.pass_rate.set(pass_rate)
        self.clip.set(s.clip_fraction)
        self.clip_side.labels("high").set(s.clip_fraction_high)
        self.clip_side.labels("low").set(s.clip_fraction_low)
        self.clip_side.labels("dual").set(s.clip_fraction_dual)
        self.tis_truncated.set(s.tis_truncated_fraction)
        self.behaviour_unknown.set(s.behaviour_unknown_fraction)
        self.overlong.set(s.overlong_sessions / s.sessions if s.sessions else 0.0)
        self.overlong_penalty.set(s.overlong_penalty_mean)
        self.advantage_std.set(s.advantage_std)
        self.entropy.set(s.entropy)
        self.response_tokens.labels("mean").set(s.response_tokens_mean)
        self.response_tokens.labels("max").set(s.response_tokens_max)
        self.computed_tokens.set(s.computed_tokens / s.trace_tokens if s.trace_tokens else 0)
        self.tis_mean.set(s.tis_mean)
        self.tis_ess.set(s.tis_ess)
        self.mismatch.set(s.logprob_mismatch)
        self.kl.set(s.kl_mean)
        self.grad_norm.set(s.grad_norm)
        self.skipped_updates.inc(s.skipped_updates)
        self.tokens.inc(s.tokens)
        self.tokens_per_s.set(s.tokens / train if train > 0 else 0)
        for phase, secs in (("wait", wait), ("train", train), ("sync", sync)):
            self.phase.labels(phase).observe(secs)

    def watch_ingest(self, counts) -> None:
        """Expose the ingest's running counts (``Ingest.counts``, read at each scrape)."""
        self._ingest.counts = counts

    def render(self) -> bytes:
        if self._nvml is not None:
            for i, util in self._nvml().items():
                self.gpu.labels(str(i)).set(util)
        return generate_latest(self.registry)


# What the batcher drops (floe_trainer.batching): trajectories untrainable, duplicate_sample,
# stale, late (of a group already taken), failed (samples reported failed for good),
# out_of_vocabulary (a token id past the model's embedding: the trainer); groups
# zero_advantage, incomplete, overlong (every session masked).
REASONS = (
    "untrainable",
    "duplicate_sample",
    "stale",
    "late",
    "failed",
    "out_of_vocabulary",
    "zero_advantage",
    "incomplete",
    "overlong",
    "no_update",
)


class _Tallies:
    """A counter family whose values are running tallies kept elsewhere (``counts``, read at
    each scrape), so it is exposed as a family rather than incremented here. ``names`` maps a
    tally's key to its label value; every one exists from the start, at 0: a series born at its
    first count shows Prometheus no increase() for it (a dashboard panel or an alert on it would
    stay empty until then). A key not in ``names`` is its own label value."""

    def __init__(self, name: str, documentation: str, label: str, names: dict) -> None:
        self.name, self.documentation, self.label, self.names = name, documentation, label, names
        self.counts: dict = {}

    def collect(self):
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        values = dict.fromkeys(self.names.values(), 0)
        for key, n in dict(self.counts).items():
            values[self.names.get(key, key)] = n
        for value, n in sorted(values.items()):
            family.add_metric([value], n)
        yield family


# The ingest's counts by the name `/v1/status` gives them, and the label Prometheus gets.
INGEST_RESULTS = {
    "accepted": "accepted",
    "duplicate": "duplicate",
    "invalid": "invalid",
    "partial": "partial",
    "partialDeltas": "partial_delta",
    "agentFault": "agent_fault",
    "agentFaultUnscored": "agent_fault_unscored",
}


def _nvml():
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no NVML library or no GPU: no GPU series
        return None

    def read() -> dict[int, float]:
        return {
            i: float(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i)).gpu)
            for i in range(count)
        }

    return read


class UtilizationSampler:
    """Mean GPU utilization (NVML, every GPU averaged) over a ``with`` block, polled every
    ``interval`` seconds; ``mean`` is None without a GPU."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self._read = _nvml()
        self.mean: float | None = None

    def __enter__(self) -> UtilizationSampler:
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = None
        if self._read is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            per_gpu = self._read()
            self._samples.append(sum(per_gpu.values()) / max(len(per_gpu), 1))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.mean = sum(self._samples) / len(self._samples) if self._samples else 0.0
