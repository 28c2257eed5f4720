"""The fidelity check's figure: the trainer's log-probs of sampled tokens against vLLM's."""

import pytest
import torch
from tiny import tiny_llama

from floe_trainer.fidelity import compare
from floe_trainer.placement import CPU_FP32
from floe_trainer.policy import make_batch, token_logprobs
from floe_trainer.wire import Trace


def sampled(model, temperature):
    """Two traces whose logprobs are the model's own at ``temperature`` (what a vLLM serving
    these weights with the job's sampling would report)."""
    traces = [
        Trace([1, 2, 3], [4, 5, 6], [1] * 3, [None] * 3),
        Trace([7], [8, 9], [1, 1], [None] * 2),
    ]
    with torch.no_grad():
        logp = token_logprobs(model.eval(), make_batch(traces, temperature=temperature))
    return [
        Trace(
            t.prompt_token_ids,
            t.response_token_ids,
            t.loss_mask,
            logp[i, : len(t.logprobs)].tolist(),
        )
        for i, t in enumerate(traces)
    ]


def test_the_same_distribution_shows_no_mismatch_and_another_one_does():
    model = tiny_llama()
    traces = sampled(model, 0.6)
    same = compare(model, traces, CPU_FP32, 0.6)
    assert same["tokens"] == 5 and same["mismatch"] < 1e-6
    # Sampled at 0.6, modelled at 1.0: the trainer would train a policy nothing samples.
    other = compare(model, traces, CPU_FP32, 1.0)
    assert other["mismatch"] > 0.05 and other["max"] >= other["mismatch"]
    # Off by 0.4 nats on every token: the figure is that.
    shifted = [
        Trace(
            t.prompt_token_ids, t.response_token_ids, t.loss_mask, [lp - 0.4 for lp in t.logprobs]
        )
        for t in traces
    ]
    assert compare(model, shifted, CPU_FP32, 0.6)["mismatch"] == pytest.approx(0.4, abs=1e-5)
    # The model is left as it was found (a step may follow).
    model.train()
    compare(model, traces, CPU_FP32, 0.6)
    assert model.training
