"""Measure what GRPO steps really take on this machine, beside the memory plan's estimate for
the same settings: the proof of ``memory_plan`` (CPU in the tests, GPU in the proof script).

    python -m floe_trainer.memory_probe --model-dir DIR --sequence 1536 [--micro-batch 1
        --max-tokens N --gradient-checkpointing --reference --lora-rank R --device cpu
        --precision fp32 --steps 1 --temperature 0.7]

Prints one JSON line: the estimate's items and total, the measured peak, and their ratio. The
peak is the process's peak resident memory on CPU (``ru_maxrss``), and on a GPU the caching
allocator's peak reservation plus the plan's CUDA runtime term (the context is not visible to
the allocator). On a GPU it also prints the last step's time."""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

from .bench_step import synthetic_groups
from .distributed import SINGLE
from .lora import LoraSpec
from .memory_plan import CUDA_RUNTIME, ModelShape
from .step import train_step
from .trainer import TrainerConfig, load_policy, loss_config, step_options


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="floe_trainer.memory_probe")
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--sequence", type=int, required=True, help="tokens per trace")
    p.add_argument("--prompt", type=int, default=64, help="of which prompt tokens")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--max-tokens", type=int, help="grpo.maxTokensPerMicroBatch")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--reference", action="store_true", help="a KL reference model (klCoef > 0)")
    p.add_argument("--lora-rank", type=int, help="train.lora.rank (its default targets)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="auto")
    p.add_argument(
        "--steps", type=int, default=1, help="measured full-length steps after the warm-up"
    )
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling.temperature (tempered logits)"
    )
    args = p.parse_args(argv)
    # The trainer's own loading (``load_policy``): the plan it makes before the model loads
    # (on CPU its runtime term is this process now), then the model, adapter and optimizer.
    cfg = TrainerConfig(
        model=str(args.model_dir),
        policy_url="",
        state_dir=Path("/nonexistent"),
        num_samples=2,
        learning_rate=1e-6,
        micro_batch_size=args.micro_batch,
        max_tokens_per_micro_batch=args.max_tokens,
        gradient_checkpointing=args.gradient_checkpointing,
        kl_coef=0.1 if args.reference else 0.0,
        device=args.device,
        precision=args.precision,
        max_sequence_tokens=args.sequence,
        memory_plan="warn",
        temperature=args.temperature,
        lora=LoraSpec.from_operator({"rank": args.lora_rank}) if args.lora_rank else None,
    )
    policy = load_policy(cfg, SINGLE, None)
    plan = policy.memory_plan
    if plan is None:
        raise SystemExit(f"no plan for {args.model_dir}: it needs a config.json")
    placement = policy.placement
    shape = ModelShape.from_dir(args.model_dir)
    # The peak is a full-length micro-batch's forward and backward while the gradients of the
    # step's earlier micro-batches and AdamW's state exist. So: one warm-up step on short
    # traces (it makes the optimizer's state), then steps of two full micro-batches of
    # micro-batch-many full-length traces each. (Two full-length steps, as before, reach the
    # same peak at twice the CPU time.)
    warm_up = synthetic_groups(1, 2, args.prompt, 8, shape.vocab)
    full = synthetic_groups(
        1, 2 * max(args.micro_batch, 1), args.prompt, args.sequence - args.prompt, shape.vocab
    )
    cuda = placement.device.type == "cuda"
    seconds = 0.0
    for groups in [warm_up] + [full] * max(args.steps, 1):
        start = time.perf_counter()
        train_step(
            policy.model,
            policy.optimizer,
            groups,
            loss_config(cfg),
            placement=placement,
            reference=policy.reference,
            **step_options(cfg),
        )
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    extra = {}
    if cuda:
        peak = torch.cuda.max_memory_reserved() + CUDA_RUNTIME
        extra = {
            "allocatedPeakBytes": torch.cuda.max_memory_allocated(),
            "lastStepSeconds": round(seconds, 3),
            "gpu": torch.cuda.get_device_name(),
        }
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "model": str(args.model_dir),
                "parameters": shape.parameters,
                "settings": {
                    "device": placement.device.type,
                    "precision": placement.precision,
                    "sequence": args.sequence,
                    "microBatch": args.micro_batch,
                    "maxTokens": args.max_tokens,
                    "gradientCheckpointing": args.gradient_checkpointing,
                    "reference": args.reference,
                    "loraRank": args.lora_rank,
                    "temperature": args.temperature,
                },
                "estimate": {k: v for k, v in plan.items() if k != "capacityBytes"},
                "peakBytes": peak,
                "estimateOverPeak": round(plan["totalBytes"] / peak, 4),
                **extra,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
