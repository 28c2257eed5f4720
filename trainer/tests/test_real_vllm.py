"""Against the real vLLM OpenAI server on CPU serving SmolLM2-135M-Instruct (a copy: this
test changes its weights): sample a GRPO group through vLLM with token ids and logprobs, train
one step, push the weights into the running server, and check that vLLM now serves exactly
the trained policy. Needs FLOE_TEST_MODELS (scripts/test.sh sets it); never skips."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from floe_trainer.batching import GroupBuffer
from floe_trainer.learn_demo import sample, trajectory
from floe_trainer.loss import LossConfig
from floe_trainer.policy import make_batch, token_logprobs
from floe_trainer.step import train_step
from floe_trainer.vllm_sync import prompt_logprobs, push
from floe_trainer.wire import Trace, parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    models = os.environ.get("FLOE_TEST_MODELS")
    assert models, "FLOE_TEST_MODELS must name the converted models (scripts/vllm-cpu/setup.sh)"
    model_dir = tmp_path_factory.mktemp("policy") / "smollm2"
    shutil.copytree(Path(models) / "smollm2-135m-instruct", model_dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(model_dir.parent / "vllm.log", "w")  # noqa: SIM115 (lives as long as the server)
    server = subprocess.Popen(
        [str(ROOT / "scripts/vllm-cpu/serve.sh"), sys.executable, str(model_dir), str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            assert server.poll() is None, (model_dir.parent / "vllm.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vLLM did not start in 240 s"
            time.sleep(1)
    yield url, model_dir
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=60)


def group_bodies(url, prompt, task):
    """A group of 4 sampled from vLLM; reward: shorter answers score higher (+ a tie-break)."""
    choices = sample(url, prompt, 4, seed=7, max_tokens=16)
    return [
        trajectory(
            f"j-{task}-{i}", f"j/{task}", i, prompt, c, 1.0 - len(c["token_ids"]) / 16 + 0.01 * i
        )
        for i, c in enumerate(choices)
    ]


def test_one_trained_step_is_exactly_what_vllm_serves_after_the_push(served):
    url, model_dir = served
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Name a fruit."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    bodies = group_bodies(url, prompt, "fruit")
    buffer = GroupBuffer(num_samples=4)
    for body in bodies:
        buffer.add(parse(body), now=0)
    [group] = buffer.take_ready(now=0, policy_version=0)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    first = bodies[0]["traces"][0]
    ids0 = first["response_token_ids"]
    probe = prompt + ids0
    trace = Trace(prompt, ids0, [1] * len(ids0), [None] * len(ids0))
    # Before: the trainer and vLLM agree on the behaviour logprobs.
    with torch.no_grad():
        before_trainer = token_logprobs(model, make_batch([trace]))[0].tolist()
    behaviour = first["logprobs"]
    assert max(abs(a - b) for a, b in zip(before_trainer, behaviour, strict=True)) < 1e-3
    before_vllm = prompt_logprobs(url, "policy", probe)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    stats = train_step(model, opt, [group], LossConfig(), micro_batch_size=2)
    assert stats.tokens == sum(len(b["traces"][0]["response_token_ids"]) for b in bodies)
    assert stats.logprob_mismatch < 1e-3
    timing = push(model, url, model_dir)
    print(
        f"\nweight push: save {timing['save_seconds']:.2f} s,"
        f" paused {timing['paused_seconds']:.2f} s"
    )

    after_vllm = prompt_logprobs(url, "policy", probe)
    with torch.no_grad():
        after_trainer = token_logprobs(model, make_batch([trace]))[0].tolist()
    n = len(after_trainer)
    served_vs_trained = max(abs(a - b) for a, b in zip(after_vllm[-n:], after_trainer, strict=True))
    moved = max(abs(a - b) for a, b in zip(after_vllm, before_vllm, strict=True))
    print(f"served vs trained max |Δlogprob| {served_vs_trained:.2e}; moved by {moved:.3f}")
    assert served_vs_trained < 2e-3, "vLLM serves the trained weights"
    assert moved > 1e-2, "the push changed what vLLM serves"


def post_json(url, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def test_the_loop_trains_pushes_checkpoints_and_resumes_without_losing_anything(served, tmp_path):
    import threading

    from floe_trainer.ingest import make_server
    from floe_trainer.trainer import Trainer, TrainerConfig

    url, model_dir = served
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Name a colour."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    conf = {
        "model": str(model_dir),
        "policyUrl": url,
        "numSamples": 4,
        "grpo": {"groupsPerStep": 1, "learningRate": 1e-5, "microBatchSize": 2},
        "checkpoint": {"everySteps": 1, "keep": 2},
    }

    def start():
        t = Trainer(TrainerConfig.from_operator(conf, tmp_path / "state"))
        srv = make_server(t.ingest, ("127.0.0.1", 0), t.status, t.metrics.render)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return t, srv, f"http://127.0.0.1:{srv.server_address[1]}"

    trainer, srv, ingest = start()
    for body in group_bodies(url, prompt, "colour"):
        assert post_json(f"{ingest}/v1/trajectories", body) == 200
    stats = trainer.run_once()
    assert stats is not None and stats.sequences == 4
    status = json.loads(urllib.request.urlopen(f"{ingest}/v1/status").read())
    assert (status["step"], status["policyVersion"]) == (1, 1)
    # vLLM now serves the trained weights, reloaded from the trainer's own weights dir.
    probe = prompt + [28, 29, 30]
    with torch.no_grad():
        mine = token_logprobs(
            trainer.model, make_batch([Trace(prompt, [28, 29, 30], [1] * 3, [None] * 3)])
        )[0].tolist()
    served_lp = prompt_logprobs(url, "policy", probe)[-3:]
    assert max(abs(a - b) for a, b in zip(served_lp, mine, strict=True)) < 2e-3
    metrics = urllib.request.urlopen(f"{ingest}/metrics").read().decode()
    assert "floe_trainer_step 1.0" in metrics
    assert 'floe_trainer_step_phase_seconds_count{phase="sync"} 1.0' in metrics

    # Acknowledged but not yet trained when the trainer dies.
    for body in group_bodies(url, prompt, "shade"):
        assert post_json(f"{ingest}/v1/trajectories", body) == 200
    srv.shutdown()
    srv.server_close()
    del trainer

    trainer, srv, ingest = start()
    assert (trainer.state.step, trainer.state.policy_version) == (1, 1), "resumed at the checkpoint"
    assert list(trainer.buffer.pending) == ["j/shade"], "replayed: only what was not trained"
    assert trainer.run_once() is not None
    assert (trainer.state.step, trainer.state.policy_version) == (2, 2)
    assert sorted(p.name for p in (tmp_path / "state/checkpoints").glob("ckpt-*")) == [
        "ckpt-1",
        "ckpt-2",
    ]
    srv.shutdown()


def test_it_learns_a_verifiable_toy_task(served):
    """GRPO on "answer briefly" (reward = 1 - tokens/24): a few steps on CPU raise the held-out
    mean reward well above the untrained policy's."""
    from floe_trainer.learn_demo import run

    url, model_dir = served
    baseline, final, curve = run(url, model_dir, steps=6)
    print("curve:", [round(r, 3) for _, r, _, _ in curve])
    assert final >= baseline + 0.3, (baseline, final, curve)
