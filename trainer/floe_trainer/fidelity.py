"""The fidelity check: does the trainer model the distribution vLLM samples from?

Before any session of a train run, a few completions are sampled from the policy server with
the exact requests a session's gateway makes, and their tokens come here with vLLM's
log-probs (``POST /v1/fidelity``, the control token). The trainer scores the same tokens under
its own policy at the job's temperature; the mean absolute difference per token is the figure
each step reports as ``logprobMismatch``, measured before the first session instead of after
the first step. A sampling default the requests leave to vLLM (a model's
``generation_config.json``: Qwen3's ``top_k`` 20 moved it to 0.40 nats), a tokenizer or dtype
mismatch, or weights that are not the trainer's show here, before a GPU-hour is spent.

The body: ``{"traces": [{"prompt_token_ids": [...], "response_token_ids": [...],
"logprobs": [...]}]}`` (the trajectory's trace fields; ``loss_mask`` optional).
"""

from __future__ import annotations

import torch

from .placement import Placement
from .policy import make_batch, token_logprobs
from .wire import InvalidTrajectory, Trace, parse_trace

# Traces and tokens one check takes at most (it is a probe, not a workload).
MAX_TRACES = 16
MAX_TOKENS = 16384


def parse_request(body: object) -> list[Trace]:
    if not isinstance(body, dict) or not isinstance(body.get("traces"), list):
        raise InvalidTrajectory('expected {"traces": [...]}')
    raw = body["traces"]
    if not 0 < len(raw) <= MAX_TRACES:
        raise InvalidTrajectory(f"between 1 and {MAX_TRACES} traces")
    traces = []
    for i, t in enumerate(raw):
        if isinstance(t, dict) and "loss_mask" not in t:
            t = {**t, "loss_mask": [1] * len(t.get("response_token_ids") or [])}
        trace = parse_trace(t, f"traces[{i}]")
        if not trace.response_token_ids or any(lp is None for lp in trace.logprobs):
            raise InvalidTrajectory(f"traces[{i}] needs sampled tokens, each with its logprob")
        traces.append(trace)
    tokens = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in traces)
    if tokens > MAX_TOKENS:
        raise InvalidTrajectory(f"{tokens} tokens > {MAX_TOKENS}")
    return traces


def compare(
    model: torch.nn.Module,
    traces: list[Trace],
    placement: Placement,
    temperature: float,
    pad_id: int = 0,
) -> dict:
    """The trainer's log-probs of the sampled tokens against vLLM's: ``tokens``, the mean and
    the largest absolute difference (nats)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), placement.autocast():
            batch = make_batch(traces, pad_id, temperature).to(placement.device)
            logp = token_logprobs(model, batch).cpu()
    finally:
        model.train(was_training)
    deltas = [
        abs(float(logp[row, j]) - float(lp))
        for row, t in enumerate(traces)
        for j, lp in enumerate(t.logprobs)
    ]
    return {
        "tokens": len(deltas),
        "mismatch": sum(deltas) / max(len(deltas), 1),
        "max": max(deltas, default=0.0),
    }
