"""One GRPO step of a tiny Llama over fixed groups, in this process alone or as one of the
processes ``torchrun`` starts (gloo, FSDP2): the leader saves the updated weights and the
step's figures to ``OUT``. ``test_distributed.py`` runs it both ways and compares. With
``lora`` last, a LoRA adapter trains (the weights saved are the merged ones, the adapter
beside them).

    dp_step.py OUT adamw|sgd [lora] [SequenceMean|TokenSumNorm] [shared]

``shared``: passes of up to four traces, so a group's samples share rows (prompt sharing)."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny import tiny_llama  # noqa: E402

from floe_trainer import lora, policy  # noqa: E402
from floe_trainer.batching import Group  # noqa: E402
from floe_trainer.distributed import (  # noqa: E402
    broadcast_weights,
    exit_process,
    from_env,
    full_state_dict,
    leave,
    shard,
)
from floe_trainer.loss import LossConfig  # noqa: E402
from floe_trainer.step import train_step  # noqa: E402
from floe_trainer.wire import parse  # noqa: E402


def groups() -> list[Group]:
    g = torch.Generator().manual_seed(7)
    out = []
    for task in range(2):
        prompt = torch.randint(1, 64, (5 + task,), generator=g).tolist()
        trajectories, advantages = [], []
        for sample in range(3):
            n = 3 + sample + task
            response = torch.randint(1, 64, (n,), generator=g).tolist()
            body = {
                "format": "floe.trajectory/v1",
                "session": f"s{task}-{sample}",
                "task": str(task),
                "group": f"dp/{task}",
                "sample": sample,
                "status": "completed",
                "trainable": True,
                "reward": sample / 2,
                "builder": "per_request",
                "policy_versions": [0],
                "traces": [
                    {
                        "prompt_token_ids": prompt,
                        "response_token_ids": response,
                        "loss_mask": [1] * n,
                        "logprobs": [-1.0 - 0.1 * j for j in range(n)],
                    }
                ],
            }
            trajectories.append(parse(body))
            advantages.append(sample - 1.0)
        out.append(Group(f"dp/{task}", trajectories, advantages))
    return out


def main(
    out: Path, optimizer_name: str, adapter: bool, aggregation: str = "TokenMean", micro: int = 1
) -> None:
    torch.set_num_threads(1)
    # Responses of 3-6 tokens in chunks of 2: several chunks each, the checkpointed head of
    # the chunked log-probs, sharded too (``register_sharded_logprobs``), in both runs.
    policy.LOGITS_CHUNK = 2
    world = from_env("cpu")
    model = tiny_llama(seed=3)
    if adapter:
        # As ``trainer.load_policy`` does: each process draws its own adapter (here each from
        # another seed, so only the leader's broadcast can make them one), the leader's wins.
        lora.INIT_SEED = world.rank
        model = lora.wrap(model, lora.LoraSpec(4, 8.0))
        broadcast_weights(model, world, trainable_only=True)
    model = shard(model, world, "cpu")
    trained = lora.trainable(model)
    # AdamW as the trainer uses it (large enough a rate for the clip to act), or SGD, whose
    # update is the gradient itself: the check that the summed gradient is the same.
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(trained, lr=0.5)
    else:
        optimizer = torch.optim.AdamW(trained, lr=3e-2)
    stats = train_step(
        model,
        optimizer,
        groups(),
        LossConfig(aggregation=aggregation, sum_norm=8.0),
        micro_batch_size=micro,
        mini_batches=2,
        epochs=2,
        world=world,
    )
    weights = full_state_dict(model, world)
    # The trainer's LoRA gathers: the adapter alone (pushes, checkpoints), and the whole
    # model merged (the final checkpoint).
    adapter_only = full_state_dict(model, world, trainable_only=adapter) if adapter else {}
    if world.leader:
        out.mkdir(parents=True, exist_ok=True)
        if adapter:
            torch.save(adapter_only, out / "adapter.pt")
            weights, _ = lora.merged_weights(weights, lora.LoraSpec(4, 8.0))
        torch.save(weights, out / "weights.pt")
        # Whether its log-probs took the chunked path (sharded: the registered method).
        chunked = policy._chunkable(model)
        figures = {**stats.__dict__, "processes": world.size, "chunked": chunked}
        (out / "stats.json").write_text(json.dumps(figures))
    leave()


if __name__ == "__main__":
    rest = sys.argv[3:]
    modes = [a for a in rest if a not in ("lora", "shared")]
    main(Path(sys.argv[1]), sys.argv[2], "lora" in rest, *modes, micro=4 if "shared" in rest else 1)
    exit_process(0)
