"""Checkpoints a trainer killed without warning leaves behind (SIGKILL, an OOM kill, a node
lost: no SIGTERM, no stop checkpoint): whole ones or none, and the newest whole one is what a
restarted trainer resumes from."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from floe_trainer.checkpoint import latest, load_state
from floe_trainer.durable import write_with

TRAINER = Path(__file__).resolve().parents[1]

# A process that writes checkpoint `step` the way the trainer does and stops halfway through
# (its weights file written, its state.json not yet), waiting to be killed.
HALF_WRITTEN = """
import sys, time
from pathlib import Path
from floe_trainer.durable import write_with

def write(tmp: Path) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "model.safetensors").write_bytes(b"x" * 4096)
    print("half", flush=True)
    time.sleep(600)

write_with(Path(sys.argv[1]) / f"ckpt-{sys.argv[2]}", write)
"""


def whole(directory: Path, step: int) -> Path:
    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "model.safetensors").write_bytes(b"w" * 64)
        (tmp / "state.json").write_text(json.dumps({"step": step, "policy_version": step}))

    return write_with(directory / f"ckpt-{step}", write)


def test_a_trainer_killed_while_writing_a_checkpoint_leaves_the_previous_one_newest(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    whole(checkpoints, 1)
    p = subprocess.Popen(
        [sys.executable, "-c", HALF_WRITTEN, str(checkpoints), "2"],
        env={**os.environ, "PYTHONPATH": str(TRAINER)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "half"
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        p.kill()
    # The half-written one sits beside the checkpoints under a name no reader takes.
    assert (checkpoints / ".ckpt-2.tmp/model.safetensors").exists()
    assert not (checkpoints / "ckpt-2").exists()
    assert latest(checkpoints) == checkpoints / "ckpt-1"
    assert load_state(latest(checkpoints)).step == 1
    # The restarted trainer's next checkpoint of that step is written whole over the remains.
    whole(checkpoints, 2)
    assert latest(checkpoints) == checkpoints / "ckpt-2"
    assert not (checkpoints / ".ckpt-2.tmp").exists()


def test_a_write_that_fails_midway_leaves_no_checkpoint_of_that_step(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    whole(checkpoints, 1)

    def fails(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        (tmp / "model.safetensors").write_bytes(b"x")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_with(checkpoints / "ckpt-2", fails)
    assert latest(checkpoints) == checkpoints / "ckpt-1"
    # A directory named like a checkpoint with no state.json (copied in by hand, cut short)
    # is not one either.
    (checkpoints / "ckpt-3").mkdir()
    (checkpoints / "ckpt-3/model.safetensors").write_bytes(b"x")
    assert latest(checkpoints) == checkpoints / "ckpt-1"
