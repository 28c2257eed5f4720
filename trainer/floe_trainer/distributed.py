"""Data-parallel training over several processes (one per GPU, or several CPU processes with
gloo in the tests) with PyTorch's own engine: FSDP2 ``fully_shard`` shards parameters,
gradients and AdamW's state over the processes; each decoder layer is gathered whole only
while it computes.

Every process runs the same step over the same groups and trains its own share of each
mini-batch's traces (``World.shares``). FSDP's collectives run in every forward and backward
pass, so every process makes the same number of passes: one with fewer traces makes a pass
whose loss counts zero. The loss of each trace keeps its weight in the whole
mini-batch's token mean, and FSDP's gradient average over the processes is undone by scaling
each process's loss by their number: the summed gradient equals one process's over the whole
mini-batch.

Weights leave the shards only whole (``full_state_dict``: a collective every process calls;
the leader gets the tensors), for a push into vLLM or a checkpoint."""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import torch
import torch.distributed as dist

from .lora import trainable
from .policy import register_sharded_logprobs

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.size > 1

    def shares(self, items: list[T]) -> list[list[T]]:
        """Every process's traces of a mini-batch, by rank (every ``size``-th from its own)."""
        return [items[r :: self.size] for r in range(self.size)]


SINGLE = World()

# How often an idle leader tells the other processes it is still there (they wait for its
# next order in a collective, which times out).
HEARTBEAT_SECONDS = 60.0

# Whether this process joined a world of several (``exit_process``).
_JOINED = False


def from_env(device_type: str) -> World:
    """The world ``torchrun`` describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), joined:
    NCCL between GPUs, gloo between CPU processes. One process: no process group at all."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return SINGLE
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        # A step, a checkpoint or a gather of a large model may take long; the leader's
        # heartbeat (``HEARTBEAT_SECONDS``) keeps the followers' waits for orders short.
        dist.init_process_group(backend(device_type), timeout=datetime.timedelta(hours=2))
    global _JOINED
    _JOINED = True
    return World(dist.get_rank(), dist.get_world_size())


def leave() -> None:
    """Leave the world before the interpreter exits. Left to the exit, gloo's threads were
    torn down under a live process group and a follower aborted ("terminate called without
    an active exception", SIGABRT) after its work was done: a failed container to Kubernetes,
    and a flaky CI run."""
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End the program. A process that joined a world of several ends without the
    interpreter's finalization, once what it printed and logged is flushed: ``leave`` drops
    the world, but the sharded model's FSDP state still holds the process group, so its gloo
    threads went down in finalization, beside the peer's own teardown, and a leader aborted
    after writing all it had to ("terminate called without an active exception", SIGABRT; a
    CI run on a loaded 2-core machine). One process exits as usual."""
    if not _JOINED:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def backend(device_type: str) -> str:
    """NCCL for the GPU tensors (FSDP's gathers and reductions) and gloo beside it for the CPU
    ones (``total``'s sums, checkpoints gathered to CPU): NCCL alone refuses a CPU tensor
    ("No backend type associated with device type cpu", seen on the first GPU run)."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def shard(model: torch.nn.Module, world: World, device_type: str) -> torch.nn.Module:
    """FSDP2 over ``world``: each decoder layer its own unit (gathered one at a time), the
    rest (embeddings, final norm, head) the root's. Parameters stay fp32 (the master copy);
    bf16 comes from autocast inside the layers, as on one device."""
    if not world.sharded:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (world.size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    register_sharded_logprobs(model)
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers to shard")
    return list(layers)


def full_state_dict(
    model: torch.nn.Module, world: World, trainable_only: bool = False
) -> dict[str, torch.Tensor]:
    """The whole weights on CPU: on the leader when sharded (the others get ``{}``), as
    ``model.state_dict()`` otherwise. ``trainable_only``: the parameters that train alone (a
    LoRA adapter, without gathering its frozen base). Every process of a sharded world must
    call it."""
    if not world.sharded:
        state = model.state_dict()
        if trainable_only:
            keep = {name for name, p in model.named_parameters() if p.requires_grad}
            state = {k: v for k, v in state.items() if k in keep}
        return state
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
    )
    full = get_model_state_dict(model, options=options)
    return full if world.leader else {}


def broadcast_weights(model: torch.nn.Module, world: World, trainable_only: bool = False) -> None:
    """The leader's weights into every process's model, before it is sharded: a resumed world
    whose other processes loaded the base model (their node may not see the checkpoint).
    ``trainable_only``: the trained parameters alone (a LoRA adapter: fresh ones are drawn at
    random on each process, and the base is the same files everywhere)."""
    if not world.sharded:
        return
    with torch.no_grad():
        tensors = trainable(model) if trainable_only else list(model.state_dict().values())
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


def total(world: World, value: float) -> float:
    """``value`` summed over the processes."""
    if not world.sharded:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def gather(world: World, obj: T) -> list[T]:
    """Every process's ``obj``, in rank order."""
    if not world.sharded:
        return [obj]
    out: list = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def agree(world: World, obj: T) -> T:
    """The leader's ``obj``, on every process."""
    if not world.sharded:
        return obj
    box = [obj if world.leader else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def tell(world: World, *command) -> None:
    """The leader says what every process does next (``follow``'s loop receives it)."""
    if world.sharded:
        agree(world, command)


def full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World
) -> dict:
    """AdamW's whole state (parameter names as keys when sharded: the leader gets it, the
    others ``{}``); ``optimizer.state_dict()`` on one process. A collective when sharded."""
    if not world.sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    full = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return full if world.leader else {}


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, world: World
) -> None:
    """The inverse of ``full_optimizer_state``: the leader passes the whole state it read from
    the checkpoint, the others ``{}``; each keeps its shard of what the leader broadcasts."""
    if not world.sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(
        model,
        optimizer,
        state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
