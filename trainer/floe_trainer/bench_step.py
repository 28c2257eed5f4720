"""Optimizer-step benchmark: one GRPO step over synthetic groups (random tokens, rewards
spread so every group trains) for each training configuration, timed after a warm-up step.
Prints step time, trained tokens/s, peak GPU memory and mean GPU utilization (NVML), and each
configuration's speed as a ratio against the first row, measured in the same run: fp32 with
the traces' passes in arrival order (no length bucketing). With ``--response-min`` the
responses' lengths spread uniformly between it and ``--response`` (agent traces vary so),
which is where bucketing saves padding. Each group's samples share their prompt, as GRPO's do,
which is what prompt sharing (``sharing``) saves: the rows with and without it show how much.

    python -m floe_trainer.bench_step --model-dir DIR [--groups 8 --samples 8
        --prompt 512 --response 512 --response-min 64 --micro-batch 8 --steps 3
        --precisions fp32,bf16]"""

from __future__ import annotations

import argparse
import functools
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .batching import Group
from .loss import LossConfig
from .metrics import UtilizationSampler
from .placement import Placement, resolve
from .step import train_step
from .vllm_sync import save_weights
from .wire import parse


def synthetic_groups(
    groups: int,
    samples: int,
    prompt: int,
    response: int,
    vocab: int,
    seed: int = 0,
    response_min: int | None = None,
) -> list[Group]:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        p = [rng.randrange(vocab) for _ in range(prompt)]
        trajectories, advantages = [], []
        for s in range(samples):
            n = rng.randint(response_min, response) if response_min else response
            r = [rng.randrange(vocab) for _ in range(n)]
            body = {
                "format": "floe.trajectory/v1",
                "session": f"b{g}-{s}",
                "task": str(g),
                "group": f"bench/{g}",
                "sample": s,
                "status": "completed",
                "trainable": True,
                "reward": s / max(samples - 1, 1),
                "builder": "per_request",
                "policy_versions": [0],
                "traces": [
                    {
                        "prompt_token_ids": p,
                        "response_token_ids": r,
                        "loss_mask": [1] * n,
                        "logprobs": [-rng.uniform(0.1, 5.0) for _ in r],
                    }
                ],
            }
            trajectories.append(parse(body))
            advantages.append(s - (samples - 1) / 2)
        out.append(Group(f"bench/{g}", trajectories, advantages))
    return out


def measure(
    model_dir: Path,
    placement: Placement,
    checkpointing: bool,
    kl: bool,
    groups: list[Group],
    micro_batch: int,
    steps: int,
    bucketing: bool = True,
    sharing: bool = True,
) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.to(placement.device)
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    opt = placement.optimizer(model.parameters(), 1e-6)
    reference = None
    if kl:
        reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        reference.to(placement.device).eval().requires_grad_(False)
    cfg = LossConfig(kl_coef=0.05 if kl else 0.0)
    cuda = placement.device.type == "cuda"

    step = functools.partial(
        train_step,
        model,
        opt,
        groups,
        cfg,
        micro_batch,
        placement=placement,
        reference=reference,
        length_bucketing=bucketing,
        prompt_sharing=sharing,
    )

    step()  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    util = UtilizationSampler()
    t0 = time.perf_counter()
    tokens, computed, own = 0, 0, 0
    with util:
        for _ in range(steps):
            stats = step()
            tokens += stats.tokens
            computed += stats.computed_tokens
            own += stats.trace_tokens
        if cuda:
            torch.cuda.synchronize()
    secs = (time.perf_counter() - t0) / steps
    result = {
        "step_s": secs,
        "tokens_per_s": tokens / steps / secs,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "gpu_util": util.mean,
        "computed_share": computed / max(own, 1),
    }
    del step, model, opt, reference
    if cuda:
        torch.cuda.empty_cache()
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--device", default="auto")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--response", type=int, default=512)
    p.add_argument("--response-min", type=int, help="responses spread from this to --response")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--precisions", default="fp32,bf16", help="the rows to run (bf16 is for a GPU)")
    a = p.parse_args()
    vocab = AutoModelForCausalLM.from_pretrained(a.model_dir).config.vocab_size
    groups = synthetic_groups(
        a.groups, a.samples, a.prompt, a.response, vocab, response_min=a.response_min
    )
    spread = f"{a.response_min}-" if a.response_min else ""
    print(
        f"{a.groups} groups x {a.samples} samples, prompt {a.prompt} + response {spread}"
        f"{a.response} tokens, micro-batch {a.micro_batch}, {a.steps} timed steps"
    )
    # (precision, gradient checkpointing, KL reference, length bucketing, prompt sharing)
    configs = [("fp32", False, False, False, False), ("fp32", False, False, True, False)]
    configs.append(("fp32", False, False, True, True))
    configs += [("bf16", False, False, True, False), ("bf16", False, False, True, True)]
    configs += [("bf16", True, False, True, True), ("bf16", False, True, True, True)]
    wanted = set(a.precisions.split(","))
    base = None
    for precision, ckpt, kl, bucketing, sharing in configs:
        if precision not in wanted:
            continue
        placement = resolve(a.device, precision)
        name = precision + (" + grad checkpointing" if ckpt else "") + (" + KL ref" if kl else "")
        name += ("" if bucketing else ", arrival order") + (", shared" if sharing else "")
        try:
            r = measure(
                a.model_dir, placement, ckpt, kl, groups, a.micro_batch, a.steps, bucketing, sharing
            )
        except torch.OutOfMemoryError:
            print(f"{name:28s} out of GPU memory", flush=True)
            torch.cuda.empty_cache()
            continue
        base = base or r["step_s"]
        mem = f", peak {r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else ""
        util = f", GPU util {r['gpu_util']:.0f} %" if r["gpu_util"] is not None else ""
        print(
            f"{name:36s} step {r['step_s']:.3f} s, {r['tokens_per_s']:,.0f} tokens/s{mem}{util}, "
            f"computed/trace tokens {r['computed_share']:.2f}, "
            f"speed x{base / r['step_s']:.2f} vs the first row",
            flush=True,
        )

    push_write(a.model_dir)


def push_write(model_dir: Path, repeats: int = 3) -> None:
    """The File push's write (``model.safetensors``, fsynced) in fp32 and in bf16, the dtype a
    bf16 vLLM serves: vLLM reads the same bytes back on reload."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    seconds = {}
    with tempfile.TemporaryDirectory() as d:
        for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
            save_weights(model, Path(d), dtype)  # warm-up
            t0 = time.perf_counter()
            for _ in range(repeats):
                save_weights(model, Path(d), dtype)
            seconds[name] = (time.perf_counter() - t0) / repeats
    print(
        f"File push write: fp32 {seconds['fp32']:.3f} s, bf16 {seconds['bf16']:.3f} s "
        f"(x{seconds['fp32'] / seconds['bf16']:.2f} for a bf16 vLLM)",
        flush=True,
    )


if __name__ == "__main__":
    main()
