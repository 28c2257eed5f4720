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
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import written_whole
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
    return get_peft_model(model, config)


def adapted(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a policy with a LoRA adapter (PEFT's model)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def save_adapter(model, directory: Path) -> Path:
    """The adapter's files (config + safetensors), written beside and renamed: whole or
    absent."""
    return written_whole(directory, model.save_pretrained)


def merged_weights(model) -> dict[str, torch.Tensor]:
    """The base's state dict with every adapter folded in (``W + scale·B·A``), under the base
    model's own names: what ``merge_and_unload`` would give, without changing the model."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {
        name: module.get_delta_weight("default")
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer)
    }
    out = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        module = key.rsplit(".", 1)[0]
        if key.endswith(".weight") and module in deltas:
            value = (value.float() + deltas[module].float()).to(value.dtype)
        out[key] = value.detach().to("cpu")
    return out


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
    the older directories removed."""

    def __init__(self, model, vllm_url: str, directory: Path) -> None:
        self.model, self.url, self.dir = model, vllm_url, directory

    def push(self, version: int) -> dict[str, float]:
        t0 = time.monotonic()
        target = save_adapter(self.model, self.dir / f"adapter-{version}")
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
