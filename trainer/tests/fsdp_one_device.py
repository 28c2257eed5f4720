"""FSDP2 on one device, for the GPU proof (``torchrun --nproc-per-node=1``): a lent machine has
one GPU and NCCL refuses two processes on the same one, so this is the sharded path's CUDA
proof that one machine allows — ``fully_shard`` units, NCCL collectives, bf16 autocast over
fp32 DTensor master weights, the fused AdamW on DTensors, the full-state gather. The same steps
run on a plain copy of the model; the updated weights must agree (the difference's norm against
the update's: within 1e-4 in fp32 with AdamW, 5 % in bf16 with SGD), and both
are timed.

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

from floe_trainer import lora
from floe_trainer.bench_step import synthetic_groups
from floe_trainer.distributed import World, backend, full_state_dict, shard
from floe_trainer.loss import LossConfig
from floe_trainer.placement import resolve
from floe_trainer.step import train_step

LORA = lora.LoraSpec(16, 32.0)


@dataclass(frozen=True)
class ShardedAlone(World):
    """One process that still takes every sharded branch (FSDP units, collectives)."""

    @property
    def sharded(self) -> bool:
        return True


def run(
    model_dir: Path,
    world: World,
    placement,
    optimizer_name: str,
    groups,
    steps: int,
    temperature: float,
    adapter: bool = False,
):
    # A LoRA policy as ``trainer.load_policy`` builds it: the frozen base in the precision it
    # computes in (bf16 on a GPU), the adapter in fp32: one FSDP unit holds both dtypes.
    dtype = (placement.autocast_dtype or torch.float32) if adapter else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.to(placement.device)
    if adapter:
        model = lora.wrap(model, LORA)
    model = shard(model, world, placement.device.type)
    trained = lora.trainable(model)
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(trained, lr=0.1)
    else:
        optimizer = placement.optimizer(trained, 1e-4 if adapter else 1e-5)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train_step(
            model,
            optimizer,
            groups,
            LossConfig(temperature=temperature),
            micro_batch_size=4,
            placement=placement,
            world=world,
        )
        if placement.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    state = full_state_dict(model, world, trainable_only=adapter)
    weights = {k: v.detach().float().cpu() for k, v in state.items()}
    return weights, times


def compare(
    model_dir: Path,
    device: str,
    precision: str,
    optimizer_name: str,
    steps: int,
    temperature: float = 1.0,
    adapter: bool = False,
):
    placement = resolve(device, precision)
    before = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = before.get_input_embeddings().weight.shape[0]
    if adapter:
        fresh = lora.wrap(before, LORA)  # the same adapter every run draws (``INIT_SEED``)
        before = {k: v.float() for k, v in fresh.state_dict().items() if "lora_" in k}
    else:
        before = before.state_dict()
    length = 256 if device == "cuda" else 16
    groups = synthetic_groups(2, 4, length, length, vocab)
    plain, plain_times = run(
        model_dir, World(), placement, optimizer_name, groups, steps, temperature, adapter
    )
    sharded, sharded_times = run(
        model_dir,
        ShardedAlone(0, 1),
        placement,
        optimizer_name,
        groups,
        steps,
        temperature,
        adapter,
    )
    update = torch.cat([(plain[k] - before[k]).flatten() for k in before])
    gap = torch.cat([(plain[k] - sharded[k]).flatten() for k in before])
    return {
        "precision": placement.precision,
        "optimizer": optimizer_name,
        "temperature": temperature,
        "lora": adapter,
        "steps": steps,
        "largestUpdate": update.abs().max().item(),
        "largestGap": gap.abs().max().item(),
        # AdamW moves every weight by about the rate whatever its gradient's size, so bf16
        # noise in a tiny gradient can flip a weight's whole update: the norms say more.
        "gapNormOverUpdateNorm": (gap.norm() / update.norm()).item(),
        "plainStepSeconds": [round(t, 3) for t in plain_times],
        "shardedStepSeconds": [round(t, 3) for t in sharded_times],
    }


def main(model_dir: Path, steps: int) -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dist.init_process_group(backend(device))
    # fp32 at temperature 1, and at a job's sampling temperature (tempered log-probs).
    runs = [
        compare(model_dir, device, "fp32", "adamw", steps),
        compare(model_dir, device, "fp32", "adamw", steps, temperature=0.7),
        # LoRA: on a GPU a bf16 base beside the fp32 adapter in each unit.
        compare(model_dir, device, "bf16" if cuda else "fp32", "adamw", steps, adapter=True),
    ]
    if cuda:
        runs += [
            compare(model_dir, device, "bf16", "sgd", steps),
            compare(model_dir, device, "bf16", "adamw", steps),
        ]
    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "backend": dist.get_backend(),
        "runs": runs,
    }
    print(json.dumps(report))
    dist.destroy_process_group()
    # fp32: the same arithmetic through FSDP's units and collectives (TF32 is off by default).
    for exact in runs[:2]:
        assert exact["largestUpdate"] > 0, "the steps moved no weight"
        # (Not the largest gap: a weight near 1.0 rounds to its float's 1.2e-7 steps, a few
        # percent of an update of 4e-5; on the H200 the norms' ratio was 1.1e-5.)
        assert exact["gapNormOverUpdateNorm"] <= 1e-4, report
    # bf16 with SGD (the update is the gradient): the gradients agree up to bf16's noise.
    # The adapter: its update is the adapter's norm (B starts at 0), within 1e-4 of it.
    assert runs[2]["largestUpdate"] > 0 and runs[2]["gapNormOverUpdateNorm"] <= 1e-4, report
    for r in runs[3:]:
        if r["optimizer"] == "sgd":
            assert r["gapNormOverUpdateNorm"] <= 5e-2, report


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
