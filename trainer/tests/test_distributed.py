"""Data-parallel training (FSDP2 over gloo on CPU): one GRPO step in one process and in two
gives the same updated weights; the share of traces and the passes each process makes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from floe_trainer.distributed import World

HERE = Path(__file__).resolve().parent


def test_each_process_takes_every_nth_trace():
    items = list(range(5))
    assert World(0, 2).shares(items) == [[0, 2, 4], [1, 3]]
    assert World(3, 8).shares(items)[5:] == [[], [], []]  # ranks with none still take part
    assert World().shares(items) == [items] and not World().sharded


def run_step(out: Path, optimizer: str, processes: int, *extra: str) -> tuple[dict, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *sys.path])}
    script = [str(HERE / "dp_step.py"), str(out), optimizer, *extra]
    if processes == 1:
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += [f"--nproc-per-node={processes}", *script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["processes"] == processes
    return stats, torch.load(out / "weights.pt")


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_one_step_in_two_processes_updates_the_weights_as_one_process_does(tmp_path, optimizer):
    """Tolerance: the two updates differ by at most 1e-5 of the update's norm (measured: 0 on
    a 2-core x86 machine; the sums of gradients are the same but may round differently)."""
    import dp_step  # noqa: F401  (the same file the subprocesses run)
    from tiny import tiny_llama

    one, w1 = run_step(tmp_path / "one", optimizer, 1)
    two, w2 = run_step(tmp_path / "two", optimizer, 2)
    start = tiny_llama(seed=3).state_dict()
    assert set(w1) == set(w2) == set(start)
    diff = sum(float(((w1[k] - start[k]) - (w2[k] - start[k])).pow(2).sum()) for k in w1)
    norm = sum(float((w1[k] - start[k]).pow(2).sum()) for k in w1)
    assert norm > 0
    assert (diff / norm) ** 0.5 <= 1e-5
    for key in ("loss", "grad_norm", "clip_fraction", "clip_fraction_last", "tokens"):
        assert one[key] == pytest.approx(two[key], rel=1e-6, abs=1e-9), key
    assert one["updates"] == two["updates"] == 4
    assert one["chunked"] and two["chunked"], "the sharded step's logits chunked too"
    if optimizer == "adamw":
        # Four updates (2 epochs × 2 mini-batches): the policy moved and the clip acted, so
        # the old log-probs the processes swapped were used.
        assert two["clip_fraction_last"] > 0


def test_a_step_in_shared_rows_updates_alike_in_one_process_and_in_two(tmp_path):
    """Prompt sharing sharded: each process lays its share's traces out in shared rows, and
    the check against padded rows runs in every process alike (its collectives match)."""
    from tiny import tiny_llama

    one, w1 = run_step(tmp_path / "one", "sgd", 1, "TokenMean", "shared")
    two, w2 = run_step(tmp_path / "two", "sgd", 2, "TokenMean", "shared")
    for stats in (one, two):
        assert stats["computed_tokens"] < stats["trace_tokens"], stats
    start = tiny_llama(seed=3).state_dict()
    diff = sum(float(((w1[k] - start[k]) - (w2[k] - start[k])).pow(2).sum()) for k in w1)
    norm = sum(float((w1[k] - start[k]).pow(2).sum()) for k in w1)
    assert norm > 0 and (diff / norm) ** 0.5 <= 1e-5, (diff / norm) ** 0.5
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-6)


@pytest.mark.parametrize("aggregation", ["SequenceMean"])
def test_each_aggregation_updates_alike_in_one_process_and_in_two(tmp_path, aggregation):
    """One normaliser per mini-batch, whatever share of it each process trains: SGD (the
    update is the summed gradient) in one process and in two, within 1e-5 of its norm.
    TokenMean is the test above's; TokenSumNorm's weights come from the same place as
    SequenceMean's (``aggregation_weights`` over the whole mini-batch, test_step.py), so one
    more pair of runs (~50 s on 2 cores) would prove nothing new."""
    from tiny import tiny_llama

    one, w1 = run_step(tmp_path / "one", "sgd", 1, aggregation)
    two, w2 = run_step(tmp_path / "two", "sgd", 2, aggregation)
    start = tiny_llama(seed=3).state_dict()
    diff = sum(float(((w1[k] - start[k]) - (w2[k] - start[k])).pow(2).sum()) for k in w1)
    norm = sum(float((w1[k] - start[k]).pow(2).sum()) for k in w1)
    assert norm > 0 and (diff / norm) ** 0.5 <= 1e-5, (diff / norm) ** 0.5
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-6)


def test_a_lora_step_in_two_processes_trains_the_adapter_as_one_process_does(tmp_path):
    """``train.lora`` over several processes: the frozen base and the adapter sharded alike
    (FSDP2), each process drawing its own fresh adapter until the leader's is broadcast. The
    gathered adapter and the merged weights equal one process's within 1e-5 of the update's
    norm; the base never moves (the merged weights minus the adapter's product are it)."""
    from tiny import tiny_llama

    one, _ = run_step(tmp_path / "one", "adamw", 1, "lora")
    two, _ = run_step(tmp_path / "two", "adamw", 2, "lora")
    a1 = torch.load(tmp_path / "one" / "adapter.pt")
    a2 = torch.load(tmp_path / "two" / "adapter.pt")
    assert set(a1) == set(a2) and a1 and all("lora_" in k for k in a1)
    # B starts at 0: its norm is the update's.
    norm = sum(float(v.pow(2).sum()) for k, v in a1.items() if "lora_B" in k)
    diff = sum(float((a1[k] - a2[k]).pow(2).sum()) for k in a1)
    assert norm > 0 and (diff / norm) ** 0.5 <= 1e-5, (diff / norm) ** 0.5
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-6)
    assert one["updates"] == two["updates"] == 4
    merged1 = torch.load(tmp_path / "one" / "weights.pt")
    merged2 = torch.load(tmp_path / "two" / "weights.pt")
    base = tiny_llama(seed=3).state_dict()
    assert set(merged1) == set(merged2) == set(base)
    moved = [k for k in base if not torch.equal(merged1[k], base[k])]
    assert moved and all(k.endswith("proj.weight") for k in moved), moved
    for k in base:
        torch.testing.assert_close(merged2[k], merged1[k], rtol=0, atol=1e-6)


def test_the_sharded_path_in_one_process_updates_as_the_plain_path_does(tmp_path):
    """``fsdp_one_device.py``, the GPU proof's FSDP check (one process: NCCL refuses two on
    one GPU), kept working on CPU: every sharded branch (units, collectives, the full-state
    gather) against the plain path, fp32 AdamW, at temperature 1 and at 0.7 (tempered
    log-probs), and a LoRA adapter, within 1e-4 of the update's norm."""
    from tiny import tiny_llama

    tiny_llama(seed=5).save_pretrained(tmp_path / "model")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *sys.path])}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU run (gpu-scale-proof.sh runs it on a GPU)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [
        "--nproc-per-node=1",
        str(HERE / "fsdp_one_device.py"),
        str(tmp_path / "model"),
        "2",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["backend"] == "gloo"
    assert [(r["temperature"], r["lora"]) for r in report["runs"]] == [
        (1.0, False),
        (0.7, False),
        (1.0, True),
    ]
    for run in report["runs"]:
        assert run["largestUpdate"] > 0 and run["gapNormOverUpdateNorm"] <= 1e-4


def test_a_process_of_a_world_exits_with_its_output_flushed_and_one_process_as_usual():
    """``exit_process``: one process raises ``SystemExit`` (what the tests and a plain run
    see); one that joined a world ends at once with its code, what it printed and logged
    flushed (the interpreter's finalization skipped: the gloo teardown that aborted there)."""
    from floe_trainer import distributed

    with pytest.raises(SystemExit) as ended:
        distributed.exit_process(4)
    assert ended.value.code == 4
    script = (
        "import atexit, logging, sys\n"
        "from floe_trainer import distributed\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "atexit.register(lambda: print('finalized'))\n"
        "distributed._JOINED = True\n"
        "print('done', end='')\n"
        "logging.getLogger('t').info('logged')\n"
        "distributed.exit_process(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == "done"  # flushed, and no atexit handler ran
    assert "logged" in done.stderr


def test_a_trainer_of_two_processes_makes_the_fidelity_check_as_one_process_does(tmp_path):
    """``POST /v1/fidelity`` on a sharded trainer: asked from the HTTP server's thread, the
    leader's loop tells every process to take part in the forward (FSDP2's collectives), and the
    figure is one process's (it answered 501 before: the check was recorded as skipped)."""
    import fidelity_world
    from tiny import tiny_llama

    from floe_trainer.fidelity import compare
    from floe_trainer.placement import CPU_FP32

    model = tiny_llama(seed=9)
    model.save_pretrained(tmp_path / "model")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *sys.path])}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(HERE / "fidelity_world.py")]
    command += [str(tmp_path / "model"), str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    two = json.loads((tmp_path / "fidelity.json").read_text())
    one = compare(model, fidelity_world.probes(), CPU_FP32, fidelity_world.TEMPERATURE)
    assert two["processes"] == 2
    assert two["tokens"] == one["tokens"] == 5
    assert two["mismatch"] == pytest.approx(one["mismatch"], rel=1e-5)
    assert two["max"] == pytest.approx(one["max"], rel=1e-5)
