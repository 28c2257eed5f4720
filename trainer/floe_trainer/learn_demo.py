"""A verifiable toy task for showing that training works end to end on CPU: the model is
asked for a fruit and rewarded for short answers (reward = 1 - tokens/max_tokens). Samples
GRPO groups from the running vLLM, trains, pushes, repeats; prints the reward curve.

    python -m floe_trainer.learn_demo --vllm URL --model-dir DIR [--steps 24]

``DIR`` is the directory vLLM serves (weights are pushed there)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .batching import GroupBuffer
from .loss import LossConfig
from .step import train_step
from .vllm_sync import push
from .wire import parse

MAX_TOKENS = 24
PROMPTS = ["Name a fruit.", "Name a colour.", "Name an animal.", "Name a country."]


def sample(
    url: str, prompt: list[int], n: int, seed: int, max_tokens: int = MAX_TOKENS
) -> list[dict]:
    """``n`` completions of ``prompt`` from vLLM, with their token ids and logprobs."""
    body = {
        "model": "policy",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "n": n,
        "temperature": 1.0,
        "logprobs": 0,
        "return_token_ids": True,
        "seed": seed,
    }
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"]


def trajectory(
    session: str,
    group: str,
    sample_index: int,
    prompt: list[int],
    choice: dict,
    reward_: float,
    version: int = 0,
) -> dict:
    """A one-call trajectory in the wire format from a vLLM completion choice."""
    ids = choice["token_ids"]
    return {
        "format": "floe.trajectory/v1",
        "session": session,
        "task": group.rpartition("/")[2],
        "group": group,
        "sample": sample_index,
        "status": "completed",
        "trainable": True,
        "reward": reward_,
        "builder": "per_request",
        "policy_versions": [version],
        "traces": [
            {
                "prompt_token_ids": prompt,
                "response_token_ids": ids,
                "loss_mask": [1] * len(ids),
                "logprobs": choice["logprobs"]["token_logprobs"],
            }
        ],
    }


def reward(token_ids: list[int]) -> float:
    return 1.0 - len(token_ids) / MAX_TOKENS


def evaluate(url: str, prompts: list[list[int]], n: int, seed: int) -> float:
    return statistics.mean(
        reward(c["token_ids"]) for i, p in enumerate(prompts) for c in sample(url, p, n, seed + i)
    )


def run(url: str, model_dir: Path, steps: int, group_size: int = 8, lr: float = 2e-5):
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = []
    for q in PROMPTS:
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    baseline = evaluate(url, prompts, 16, seed=10_000)
    curve = []
    for step in range(steps):
        buffer = GroupBuffer(num_samples=group_size, estimator="MeanStd")
        rewards = []
        for gi, prompt in enumerate(prompts):
            for i, c in enumerate(sample(url, prompt, group_size, seed=step * 100 + gi)):
                r = reward(c["token_ids"])
                rewards.append(r)
                body = trajectory(f"s{step}-{gi}-{i}", f"g{step}/{gi}", i, prompt, c, r, step)
                buffer.add(parse(body), now=0)
        groups = buffer.take_ready(now=0, policy_version=step)
        t0 = time.monotonic()
        if groups:
            train_step(model, opt, groups, LossConfig(), micro_batch_size=8)
            push(model, url, model_dir)
        curve.append((step, statistics.mean(rewards), len(groups), time.monotonic() - t0))
        print(
            f"step {step:2d}: mean reward {curve[-1][1]:.3f} ({len(groups)} groups, "
            f"train+push {curve[-1][3]:.1f} s)",
            flush=True,
        )
    final = evaluate(url, prompts, 16, seed=20_000)
    print(f"held-out sampling: untrained {baseline:.3f} -> trained {final:.3f}")
    return baseline, final, curve


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--vllm", required=True)
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=24)
    a = p.parse_args()
    run(a.vllm, a.model_dir, a.steps)


if __name__ == "__main__":
    main()
