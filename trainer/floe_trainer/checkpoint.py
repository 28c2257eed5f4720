"""Checkpoints: ``DIR/ckpt-<step>/`` with the model (safetensors + config), the optimizer, and
``state.json`` (step, policy version, the sessions trained so far, the step table, what the
group buffer must not forget). Written to
a temporary directory and renamed, so a checkpoint is whole or absent; the oldest beyond
``keep`` go."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import durable

OWNER = "owner.json"


class ForeignCheckpoints(Exception):
    """The checkpoint directory holds another run's state (one line, for the job's condition)."""


def claim(directory: Path | None, job: str | None, uid: str | None) -> None:
    """The checkpoint directory is this job's run's, recorded on its first start: a job deleted
    and created again under its name on the same claim found the earlier run's state, resumed
    it, and answered every session of the new run, under the same ids, "already ingested" (or
    its group closed): dropped, while the job counted them done. Refused instead, saying so.
    A directory without a record (a run before records were kept) is taken as this run's;
    without a job uid (``floe run``, whose ``--resume`` is its own) nothing is checked."""
    if directory is None or not uid:
        return
    path = directory / OWNER
    try:
        owner = json.loads(path.read_text())
    except FileNotFoundError:
        directory.mkdir(parents=True, exist_ok=True)
        durable.write_bytes(path, json.dumps({"job": job, "uid": uid}).encode())
        return
    except (OSError, ValueError) as e:
        raise ForeignCheckpoints(f"cannot read {path}: {e}") from e
    if owner.get("uid") != uid:
        raise ForeignCheckpoints(
            f"the checkpoint claim holds the state of another run of job "
            f"{owner.get('job')!r} (uid {owner.get('uid')}; this run is uid {uid}): resuming it "
            f"would drop this run's sessions as already trained. Give the job a new "
            f"train.checkpoint.claimName, or empty the claim"
        )


@dataclass
class State:
    step: int = 0
    policy_version: int = 0
    last_step_time: str | None = None
    trained_sessions: list[str] = field(default_factory=list)
    # One row per step up to this checkpoint (the job's step table spans restarts).
    steps: list[dict] = field(default_factory=list)
    # Groups gone from the buffer for good: trained, or dropped whole (zero advantage,
    # incomplete). The operator's and `floe run`'s staleness gate counts on it: a dropped
    # group makes no step, yet the next groups may be sampled by the current policy.
    groups_done: int = 0
    # Every scored session by the policy version that sampled it (its oldest): [sessions,
    # reward sum, passed, overlong], keyed by the version as text (JSON). Groups the trainer
    # dropped (all passed, all failed) count here too: the learning curve, not only what was
    # trained.
    sampled: dict[str, list[float]] = field(default_factory=dict)
    # What the group buffer must not forget across a restart ([`GroupBuffer.saved`]): groups
    # closed (trained or dropped: a late sample of one is never a new group), samples that
    # failed for good in groups still open, versions whose weights are gone.
    closed_groups: list[str] = field(default_factory=list)
    failed_samples: dict[str, list[int]] = field(default_factory=dict)
    lost_versions: list[list[int]] = field(default_factory=list)
    # Sessions already counted in ``sampled``: a replayed one is not counted twice.
    seen_sessions: list[str] = field(default_factory=list)
    # Sessions whose groups were closed (trained or dropped) at this checkpoint: a restart
    # does not read their stored trajectories again (a long run keeps every one it was sent).
    settled_sessions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A checkpoint from before overlong sessions were counted: its rows count none.
        for row in self.sampled.values():
            row.extend([0.0] * (4 - len(row)))


def latest(directory: Path) -> Path | None:
    found = sorted(
        (p for p in directory.glob("ckpt-*") if p.is_dir() and (p / "state.json").exists()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    return found[-1] if found else None


def save(
    directory: Path, model, weights: dict | None, optimizer_state: dict, state: State, keep: int
) -> Path:
    """``weights`` and ``optimizer_state``: whole state dicts (gathered, when sharded);
    ``weights`` None: the model saves what it trains (a LoRA model: its adapter)."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        torch.save(optimizer_state, tmp / "optimizer.pt")
        (tmp / "state.json").write_text(durable.strict_json(state.__dict__))

    final = durable.write_with(directory / f"ckpt-{state.step}", write)
    old = sorted(
        (p for p in directory.glob("ckpt-*") if p.is_dir()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    for p in old[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    return final


# Files of a model directory besides the weights that a server needs to serve it.
SERVING_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
)


def save_model(final: Path, model, weights: dict, base: Path) -> Path:
    """A model directory vLLM (or ``from_pretrained``) serves as it is: the weights and config
    of ``model``, the tokenizer and chat template of the ``base`` model it was trained from.
    Written beside and renamed, so it is whole or absent."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        for name in SERVING_FILES:
            if (base / name).is_file() and not (tmp / name).exists():
                shutil.copy(base / name, tmp / name)

    return durable.write_with(final, write)


def load_state(path: Path) -> State:
    return State(**json.loads((path / "state.json").read_text()))
