"""LoRA against the real vLLM OpenAI server on CPU (SmolLM2-135M-Instruct, ``--enable-lora``,
runtime LoRA updating): the trainer pushes a no-op adapter before it is ready, trains one step
of the adapter on a group sampled through it, and vLLM then serves exactly the trained policy
under the adapter's name; the checkpoint holds the adapter and resumes; the job's end writes
the merged model, which computes what vLLM served; the same over two trainer processes (FSDP2
over the frozen base and the adapter). Needs FLOE_TEST_MODELS; never skips."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_server import ending_with_pytest, free_port, one_group, running, served_against

from floe_trainer.learn_demo import sample, trajectory
from floe_trainer.policy import make_batch, token_logprobs
from floe_trainer.trainer import Trainer, TrainerConfig
from floe_trainer.vllm_sync import prompt_logprobs, served_label
from floe_trainer.wire import Trace, parse


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    models = os.environ.get("FLOE_TEST_MODELS")
    assert models, "FLOE_TEST_MODELS must name the converted models (scripts/vllm-cpu/setup.sh)"
    # A link: vLLM and the trainer only read the base; the server's log goes beside it.
    model_dir = tmp_path_factory.mktemp("lora") / "smollm2"
    model_dir.symlink_to(Path(models) / "smollm2-135m-instruct")
    # What the operator and `floe run` start for a train.lora job (trainer_launch.rs).
    args = ["--served-model-name", "policy-base", "--enable-lora", "--max-lora-rank", "8"]
    args += ["--max-loras", "1"]
    with running(model_dir, *args, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        yield url, model_dir


def settings(url: str, model_dir: Path) -> dict:
    """The job's trainer settings as the operator writes them (``FLOE_TRAINER_CONFIG``)."""
    return {
        "model": str(model_dir),
        "numSamples": 4,
        "policyUrl": url,
        "gpus": 0,
        "maxSequenceTokens": 4096,
        "memoryPlan": "Warn",
        "lora": {"rank": 8, "alpha": 16},
        "grpo": {"groupsPerStep": 1, "microBatchSize": 2, "learningRate": 2e-3},
        "checkpoint": {"everySteps": 1},
    }


def config(url: str, model_dir: Path, state: Path) -> TrainerConfig:
    return TrainerConfig.from_operator(settings(url, model_dir), state)


def adapter_state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def test_a_lora_step_is_what_vllm_serves_and_the_job_ends_with_the_merged_model(served, tmp_path):
    url, model_dir = served
    trainer = Trainer(config(url, model_dir, tmp_path / "state"))
    # Pushed before the trainer is ready: the adapter the gateways ask for exists, as a no-op.
    assert served_label(url) == "0"
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Name a colour."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    choices = sample(url, prompt, 4, seed=11, max_tokens=16)
    for i, c in enumerate(choices):
        reward = 1.0 - len(c["token_ids"]) / 16 + 0.01 * i
        trainer.add(parse(trajectory(f"l-{i}", "l/colour", i, prompt, c, reward, 0)))
    probe_ids = choices[0]["token_ids"]
    probe = prompt + probe_ids
    base = prompt_logprobs(url, "policy-base", probe)
    noop = prompt_logprobs(url, "policy", probe)
    assert max(abs(a - b) for a, b in zip(noop, base, strict=True)) < 1e-4

    stats = trainer.run_once()
    assert stats is not None and stats.tokens > 0
    assert served_label(url) == "1"
    trace = Trace(prompt, probe_ids, [1] * len(probe_ids), [None] * len(probe_ids))
    with torch.no_grad():
        trained = token_logprobs(trainer.model, make_batch([trace]))[0].tolist()
    gap, moved = served_against(url, probe, trained, base)
    assert gap < 2e-3, "vLLM serves the trained adapter"
    assert moved > 1e-2, "the push changed what vLLM serves"
    pushed = next((tmp_path / "state" / "weights").glob("adapter-1"))
    size = sum(f.stat().st_size for f in pushed.iterdir())
    assert size < 20 * 2**20, f"a push moves the adapter ({size} bytes), not the model"
    status = trainer.status()
    assert status["lora"]["rank"] == 8 and status["lora"]["trainableParameters"] > 0

    # The checkpoint holds the adapter and its AdamW state; a new trainer resumes from it.
    ckpt = tmp_path / "state" / "checkpoints" / "ckpt-1"
    assert (ckpt / "adapter_model.safetensors").exists() and (ckpt / "optimizer.pt").exists()
    assert not (ckpt / "model.safetensors").exists()
    trained_adapter = adapter_state(trainer.model)

    trainer.finish()
    assert trainer.run_once() is None and trainer.finished
    final = tmp_path / "state" / "checkpoints" / "final"
    assert (final / "adapter" / "adapter_config.json").exists()
    assert json.loads((final / "config.json").read_text())["num_hidden_layers"] == 30
    merged = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    with torch.no_grad():
        from_merged = token_logprobs(merged, make_batch([trace]))[0].tolist()
    assert max(abs(a - b) for a, b in zip(from_merged, trained, strict=True)) < 1e-4
    del merged

    again = Trainer(config(url, model_dir, tmp_path / "state"))
    assert again.state.step == 1 and served_label(url) == "1"
    for k, v in adapter_state(again.model).items():
        torch.testing.assert_close(v, trained_adapter[k], rtol=0, atol=0)


@pytest.mark.full(
    reason="test_distributed.py checks a LoRA step in two processes equals one process's, and "
    "the test above that vLLM serves the adapter one process pushes and the merged final model"
)
def test_two_processes_train_the_adapter_vllm_serves_and_end_with_the_merged_model(
    served, tmp_path
):
    """``train.lora`` over two trainer processes, as the operator starts ``train.gpus: 2``
    (``torchrun --nproc-per-node=2 -m floe_trainer.cli serve``; gloo here, FSDP2 sharding the
    frozen base and the adapter alike): the adapter it pushes after a step is what one process
    trains on the same group (within 1e-3 of the update's norm), vLLM serves it, and the job's
    end gathers the whole model once for the merged final checkpoint."""
    from safetensors.torch import load_file

    from floe_trainer import lora
    from floe_trainer.step import train_step
    from floe_trainer.trainer import loss_config, step_options

    url, model_dir = served
    port, token = free_port(), "control-token"
    conf = {**settings(url, model_dir), "ingestListen": f"127.0.0.1:{port}"}
    ingest, state = f"http://127.0.0.1:{port}", tmp_path / "state"
    log = open(tmp_path / "trainer.log", "w")  # noqa: SIM115 (as long as the process)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        + ["-m", "floe_trainer.cli", "serve", "--state-dir", str(state)],
        env={
            **os.environ,
            "FLOE_TRAINER_CONFIG": json.dumps(conf),
            "FLOE_TRAINER_CONTROL_TOKEN": token,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), *sys.path]),
            "OMP_NUM_THREADS": "1",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=ending_with_pytest(),
    )

    def call(path: str, body: dict | None = None, auth: str | None = None) -> dict:
        headers = {"content-type": "application/json"}
        if auth:
            headers["authorization"] = f"Bearer {auth}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{ingest}{path}", data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}")

    def until(what, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            with contextlib.suppress(OSError):
                if what():
                    return
            assert trainer.poll() is None, (tmp_path / "trainer.log").read_text()[-4000:]
            assert time.monotonic() < deadline, (tmp_path / "trainer.log").read_text()[-4000:]
            time.sleep(1)

    try:
        until(lambda: urllib.request.urlopen(f"{ingest}/healthz", timeout=5).status == 200, 180)
        assert served_label(url) == "0", "the adapter pushed before the trainer is ready"
        tok = AutoTokenizer.from_pretrained(model_dir)
        text = tok.apply_chat_template(
            [{"role": "user", "content": "Name a bird."}], add_generation_prompt=True,
            tokenize=False,
        )  # fmt: skip
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        choices = sample(url, prompt, 4, seed=13, max_tokens=16)
        rewards = [1.0 - len(c["token_ids"]) / 16 + 0.01 * i for i, c in enumerate(choices)]
        bodies = [
            trajectory(f"d-{i}", "d/bird", i, prompt, c, rewards[i], 0)
            for i, c in enumerate(choices)
        ]
        for body in bodies:
            call("/v1/trajectories", body)
        until(lambda: call("/v1/status")["step"] >= 1, 300)
        assert served_label(url) == "1"
        status = call("/v1/status")
        assert status["memoryPlan"]["items"]["gathered layers"] > 0, "planned as sharded"

        # The same step in this one process, from the same fresh adapter (``lora.INIT_SEED``).
        cfg = TrainerConfig.from_operator(conf, tmp_path / "unused")
        group = one_group(bodies)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = lora.wrap(base, cfg.lora)
        start = adapter_state(model)
        opt = torch.optim.AdamW(lora.trainable(model), lr=cfg.learning_rate)
        train_step(model, opt, [group], loss_config(cfg), seed=0, **step_options(cfg))
        mine = adapter_state(model)
        pushed = load_file(str(state / "weights" / "adapter-1" / "adapter_model.safetensors"))
        pushed = {k.replace(".weight", ".default.weight"): v for k, v in pushed.items()}
        assert set(pushed) == set(mine)
        diff = sum(float((pushed[k] - mine[k]).pow(2).sum()) for k in mine)
        norm = sum(float((mine[k] - start[k]).pow(2).sum()) for k in mine)
        assert norm > 0 and (diff / norm) ** 0.5 <= 1e-3, (diff / norm) ** 0.5

        probe_ids = choices[0]["token_ids"]
        trace = Trace(prompt, probe_ids, [1] * len(probe_ids), [None] * len(probe_ids))
        with torch.no_grad():
            trained = token_logprobs(model, make_batch([trace]))[0].tolist()
        # (``base`` carries the adapter now: PEFT adapts the model it wraps in place.)
        probe = prompt + probe_ids
        gap, moved = served_against(url, probe, trained, prompt_logprobs(url, "policy-base", probe))
        assert gap < 2e-3, "vLLM serves the adapter the two processes trained"
        assert moved > 1e-2, "the push changed what vLLM serves"
        del base, model, opt

        call("/v1/finish", {}, auth=token)
        until(lambda: call("/v1/status")["finished"], 300)
        final = state / "checkpoints" / "final"
        assert (final / "adapter" / "adapter_model.safetensors").exists()
        merged = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
        with torch.no_grad():
            from_merged = token_logprobs(merged, make_batch([trace]))[0].tolist()
        assert max(abs(a - b) for a, b in zip(from_merged, trained, strict=True)) < 2e-3
        assert (state / "checkpoints" / "ckpt-1" / "adapter_model.safetensors").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(trainer.pid, signal.SIGTERM)
        try:
            trainer.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(trainer.pid, signal.SIGKILL)
