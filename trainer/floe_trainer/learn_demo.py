"""A verifiable toy task for showing that training works end to end: the model is asked for a
fruit and rewarded for short answers (reward = 1 - tokens/max_tokens). Samples GRPO groups
from the running vLLM, trains, pushes, repeats; prints the reward curve.

    python -m floe_trainer.learn_demo --vllm URL --model-dir DIR [--steps 24]
    python -m floe_trainer.learn_demo --local --model-dir DIR [--device cuda]

``DIR`` is the directory vLLM serves (weights are pushed there). ``--local`` samples with the
trained model itself (``local_sampler``) where no vLLM can run, and reports step time and GPU
utilization."""

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
from .local_sampler import LocalSampler
from .loss import LossConfig
from .metrics import UtilizationSampler
from .placement import CPU_FP32, Placement, resolve
from .step import train_step
from .vllm_sync import push
from .wire import parse

MAX_TOKENS = 24
PROMPTS = ["Name a fruit.", "Name a colour.", "Name an animal.", "Name a country."]


def sample(
    url: str,
    prompt: list[int],
    n: int,
    seed: int,
    max_tokens: int = MAX_TOKENS,
    temperature: float = 1.0,
) -> list[dict]:
    """``n`` completions of ``prompt`` from vLLM, with their token ids and logprobs."""
    body = {
        "model": "policy",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "n": n,
        "temperature": temperature,
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


class VllmSampler:
    def __init__(self, url: str, model_dir: Path) -> None:
        self.url, self.model_dir = url, model_dir
        self.version = 0

    def sample(self, prompt: list[int], n: int, seed: int, max_tokens: int) -> list[dict]:
        return sample(self.url, prompt, n, seed, max_tokens)

    def push(self, model: torch.nn.Module) -> None:
        self.version += 1
        push(model, self.url, self.model_dir, self.version)


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


def evaluate(sampler, prompts: list[list[int]], n: int, seed: int) -> float:
    return statistics.mean(
        reward(c["token_ids"])
        for i, p in enumerate(prompts)
        for c in sampler.sample(p, n, seed + i, MAX_TOKENS)
    )


def run(
    url: str | None,
    model_dir: Path,
    steps: int,
    group_size: int = 8,
    lr: float = 2e-5,
    placement: Placement = CPU_FP32,
):
    """``url`` None: sample locally with the trained model (no vLLM)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = []
    for q in PROMPTS:
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.to(placement.device)
    sampler = (
        VllmSampler(url, model_dir) if url else LocalSampler(model, tok.eos_token_id, placement)
    )
    opt = placement.optimizer(model.parameters(), lr)
    util = UtilizationSampler()
    baseline = evaluate(sampler, prompts, 16, seed=10_000)
    curve = []
    for step in range(steps):
        buffer = GroupBuffer(num_samples=group_size, estimator="MeanStd")
        rewards = []
        t_sample = time.monotonic()
        for gi, prompt in enumerate(prompts):
            for i, c in enumerate(sampler.sample(prompt, group_size, step * 100 + gi, MAX_TOKENS)):
                r = reward(c["token_ids"])
                rewards.append(r)
                body = trajectory(f"s{step}-{gi}-{i}", f"g{step}/{gi}", i, prompt, c, r, step)
                buffer.add(parse(body), now=0)
        groups = buffer.take_ready(now=0, policy_version=step)
        t0 = time.monotonic()
        gpu = None
        if groups:
            with util:
                train_step(
                    model, opt, groups, LossConfig(), micro_batch_size=8, placement=placement
                )
                if placement.device.type == "cuda":
                    torch.cuda.synchronize()
            gpu = util.mean
            sampler.push(model)
        curve.append((step, statistics.mean(rewards), len(groups), time.monotonic() - t0))
        print(
            f"step {step:2d}: mean reward {curve[-1][1]:.3f} ({len(groups)} groups, "
            f"sample {t0 - t_sample:.2f} s, train+push {curve[-1][3]:.2f} s"
            + (f", GPU util {gpu:.0f} %" if gpu is not None else "")
            + ")",
            flush=True,
        )
    final = evaluate(sampler, prompts, 16, seed=20_000)
    print(f"held-out sampling: untrained {baseline:.3f} -> trained {final:.3f}")
    return baseline, final, curve


def main() -> None:
    p = argparse.ArgumentParser()
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--vllm", help="URL of the vLLM serving --model-dir")
    src.add_argument("--local", action="store_true", help="sample with the trained model")
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    a = p.parse_args()
    run(a.vllm, a.model_dir, a.steps, placement=resolve(a.device, a.precision))


if __name__ == "__main__":
    main()
