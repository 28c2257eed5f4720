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


def test_a_checkpoint_claim_holding_another_runs_state_is_refused(tmp_path):
    """A job deleted and made again under its name, on the same claim, resumed the earlier
    run's state and dropped every session of its own as already ingested: refused, saying so."""
    import json
    import os
    import subprocess
    import sys

    import pytest

    from floe_trainer.checkpoint import OWNER, ForeignCheckpoints, claim

    ckpt = tmp_path / "checkpoints"
    claim(ckpt, "swe", "uid-1")
    assert json.loads((ckpt / OWNER).read_text()) == {"job": "swe", "uid": "uid-1"}
    claim(ckpt, "swe", "uid-1")  # its own run, restarted: fine
    claim(ckpt, "swe", None)  # floe run: its --resume is its own
    with pytest.raises(ForeignCheckpoints, match="another run of job 'swe'"):
        claim(ckpt, "swe", "uid-2")
    # The trainer says it in one line (the job's condition) before loading anything.
    from tiny import tiny_llama

    tiny_llama().save_pretrained(tmp_path / "model")
    conf = {
        "job": "swe",
        "jobUid": "uid-2",
        "model": str(tmp_path / "model"),
        "numSamples": 2,
        "gpus": 0,
        "ingestListen": "127.0.0.1:0",
        "checkpoint": {"dir": str(ckpt)},
    }
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "floe_trainer.cli", "serve", "--state-dir", str(state)],
        env={**os.environ, "FLOE_TRAINER_CONFIG": json.dumps(conf)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "holds the state of another run of job 'swe'" in last, last
    assert not (state / "weights").exists()
