"""FSDP2 on one device, for the GPU proof (``torchrun --nproc-per-node=1``): a lent machine has
one GPU and NCCL refuses two processes on the same one, so this is the sharded path's CUDA
proof that one machine allows — ``fully_shard`` units, NCCL collectives, bf16 autocast over
fp32 DTensor master weights, the fused AdamW on DTensors, the full-state gather. The same steps
run on a plain copy of the model; the updated weights must agree, and both are timed.

    torchrun --nproc-per-node=1 trainer/tests/fsdp_one_device.py MODEL_DIR [STEPS]

Prints one JSON line. On CPU (gloo) it runs too, which is how the tests here keep it working."""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from floe_trainer.bench_step import synthetic_groups
from floe_trainer.distributed import World, backend, full_state_dict, shard
from floe_trainer.loss import LossConfig
from floe_trainer.placement import resolve
from floe_trainer.step import train_step


@dataclass(frozen=True)
class ShardedAlone(World):
    """One process that still takes every sharded branch (FSDP units, collectives)."""

    @property
    def sharded(self) -> bool:
        return True


def run(model_dir: Path, world: World, placement, groups, steps: int):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.to(placement.device)
    model = shard(model, world, placement.device.type)
    optimizer = placement.optimizer(model.parameters(), 1e-5)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        stats = train_step(
            model,
            optimizer,
            groups,
            LossConfig(),
            micro_batch_size=4,
            placement=placement,
            world=world,
        )
        if placement.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return full_state_dict(model, world), times, stats


def main(model_dir: Path, steps: int) -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend("cuda" if cuda else "cpu"))
    placement = resolve("cuda" if cuda else "cpu", "auto")
    before = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    vocab = before["model.embed_tokens.weight"].shape[0]
    groups = synthetic_groups(2, 4, 256 if cuda else 16, 256 if cuda else 16, vocab)
    plain, plain_times, plain_stats = run(model_dir, World(), placement, groups, steps)
    sharded, sharded_times, sharded_stats = run(
        model_dir, ShardedAlone(0, 1), placement, groups, steps
    )
    update = max((plain[k].cpu() - before[k]).abs().max().item() for k in before)
    gap = max((plain[k].cpu() - sharded[k].cpu()).abs().max().item() for k in before)
    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "backend": dist.get_backend(),
        "precision": placement.precision,
        "steps": steps,
        "largestUpdate": update,
        "largestGapShardedVsPlain": gap,
        "gapOverUpdate": gap / update if update else None,
        "loss": [plain_stats.loss, sharded_stats.loss],
        "plainStepSeconds": [round(t, 3) for t in plain_times],
        "shardedStepSeconds": [round(t, 3) for t in sharded_times],
    }
    print(json.dumps(report))
    dist.destroy_process_group()
    assert update > 0, "the steps moved no weight"
    assert gap <= 1e-2 * update, report


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
