"""LoRA (``train.lora``): only a low-rank adapter on the model's projections trains, through
PEFT; the base stays frozen, in the precision it computes in. vLLM serves the base with the
adapter loaded under the name the gateways ask for (``policy``; the base is ``policy-base``),
and each step's push writes the adapter (megabytes) and reloads it in place while generation
is paused (``/v1/load_lora_adapter`` with ``load_inplace``, vLLM's runtime LoRA updating).
Checkpoints hold the adapter and AdamW's state of it; the final checkpoint is the merged model
(servable as the next job's model) with the adapter beside it in ``adapter/``, or the adapter
alone (``mergeFinal: false``).

The adapter's dropout is 0: the trainer's log-probs must be the ones vLLM samples with."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from . import durable
from .memory_plan import LORA_TARGETS
from .vllm_sync import paused

# vLLM's ``--max-lora-rank`` takes one of these (vllm/config/lora.py).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The adapter's name in vLLM: what the gateways ask for (trainer_launch.rs ``SERVED_MODEL``).
SERVED_ADAPTER = "policy"
# ``train.lora`` left without a rank (the CRD's default too: test_contract_defaults.py).
DEFAULT_RANK = 16


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    targets: tuple[str, ...] = LORA_TARGETS
    merge_final: bool = True

    @staticmethod
    def from_operator(c: dict | None) -> LoraSpec | None:
        """``train.lora`` as the operator writes it (``rank``, ``alpha``, ``targetModules``,
        ``mergeFinal``); None when the job trains every weight."""
        if c is None:
            return None
        rank = int(c.get("rank") or DEFAULT_RANK)
        if not 1 <= rank <= VLLM_RANKS[-1]:
            raise ValueError(f"train.lora.rank must be 1 to {VLLM_RANKS[-1]}, got {rank}")
        targets = tuple(c.get("targetModules") or LORA_TARGETS)
        alpha = float(c["alpha"]) if c.get("alpha") is not None else 2.0 * rank
        return LoraSpec(rank, alpha, targets, bool(c.get("mergeFinal", True)))


# A fresh adapter's A is drawn from this seed: the same job starts from the same adapter, on
# every process of a sharded trainer too (which also takes the leader's, ``load_policy``).
INIT_SEED = 0


def wrap(model: torch.nn.Module, spec: LoraSpec, resume: Path | None = None) -> torch.nn.Module:
    """``model`` (frozen) with a trainable adapter: a fresh one (B = 0, so the policy starts
    as the base), or the one a checkpoint holds."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if resume is not None:
        return PeftModel.from_pretrained(model, resume, is_trainable=True)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.targets),
        lora_dropout=0.0,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        return get_peft_model(model, config)


def adapted(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a policy with a LoRA adapter (PEFT's model)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def save_adapter(model, directory: Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """The adapter's files (config + safetensors), written beside and renamed: whole or
    absent. ``state``: the model's state gathered whole (``distributed.full_state_dict``; a
    sharded model's own holds shards), from which PEFT keeps the adapter's tensors."""
    return durable.write_with(directory, lambda tmp: model.save_pretrained(tmp, state_dict=state))


def adapter_module(key: str) -> str | None:
    """The module a base weight of an adapted layer belongs to (``...q_proj`` for
    ``...q_proj.base_layer.weight``); None for any other key."""
    suffix = ".base_layer.weight"
    return key[: -len(suffix)] if key.endswith(suffix) else None


def merged_weights(
    state: dict[str, torch.Tensor], spec: LoraSpec
) -> tuple[dict[str, torch.Tensor], float]:
    """The base's weights with the adapter folded in (``W + alpha/rank · B·A``), under the base
    model's own names: what PEFT's ``merge_and_unload`` gives, from the policy's whole state
    dict (``distributed.full_state_dict``: gathered when sharded), without changing the model.

    Also what the merge lost of the adapter's change to rounding, as a fraction of it (its
    Frobenius norm): a base in 16 bits (bf16 on GPUs) keeps ``W + ΔW`` in 16 bits, whose step
    near a typical weight is larger than a small RL update (bf16's step at 0.02 is 1.2e-4), so
    the merged model may be far from the trained policy where the adapter, served as is, is
    exact. 0 for fp32 weights."""
    scale = spec.alpha / spec.rank
    out = {}
    lost_sq = delta_sq = 0.0
    for key, value in state.items():
        if "lora_" in key:
            continue
        module = adapter_module(key)
        if module is not None:
            a = state[f"{module}.lora_A.default.weight"].float()
            b = state[f"{module}.lora_B.default.weight"].float()
            delta = scale * (b @ a)
            exact = value.float() + delta
            value = exact.to(value.dtype)
            lost_sq += float((value.float() - exact).pow(2).sum())
            delta_sq += float(delta.pow(2).sum())
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        out[name] = value.detach().to("cpu")
    return out, (lost_sq / delta_sq) ** 0.5 if delta_sq > 0 else 0.0


def post_text(url: str, body: dict, timeout: float = 600) -> str:
    """A control call whose answer is text (vLLM's LoRA endpoints answer "Success: ...")."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode(errors="replace")


class LoraWeightSync:
    """Each version's adapter into vLLM: written to ``<dir>/adapter-<version>`` (vLLM reads it
    while loading), loaded in place under ``SERVED_ADAPTER`` while generation is paused, then
    the older directories removed. ``adapter``: the adapter's tensors, whole (gathered from
    every process when sharded; a collective they all join)."""

    def __init__(self, model, adapter: Callable[[], dict], vllm_url: str, directory: Path) -> None:
        self.model, self.adapter, self.url, self.dir = model, adapter, vllm_url, directory

    def push(self, version: int) -> dict[str, float]:
        t0 = time.monotonic()
        target = save_adapter(self.model, self.dir / f"adapter-{version}", self.adapter())
        t1 = time.monotonic()
        paused(
            self.url,
            version,
            lambda: post_text(
                f"{self.url}/v1/load_lora_adapter",
                {"lora_name": SERVED_ADAPTER, "lora_path": str(target), "load_inplace": True},
            ),
        )
        for old in self.dir.glob("adapter-*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        return {"save_seconds": t1 - t0, "paused_seconds": time.monotonic() - t1}
