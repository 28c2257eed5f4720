"""Against the real vLLM OpenAI server on CPU serving SmolLM2-135M-Instruct as shipped (tied
embeddings; a copy: these tests change its weights): sample a GRPO group through vLLM with
token ids and logprobs, train one step, push the weights into the running server, and check
that vLLM now serves exactly the trained policy; a completion running across a push; a vLLM
that serves the base weights again; the end of a job. Needs FLOE_TEST_MODELS (scripts/test.sh
sets it); never skips."""

import contextlib
import gc
import json
import os
import shutil
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
from floe_trainer.loss import LossConfig
from floe_trainer.policy import make_batch, token_logprobs
from floe_trainer.step import train_step
from floe_trainer.vllm_sync import (
    paused,
    post,
    prompt_logprobs,
    push,
    save_weights,
    served_version,
)
from floe_trainer.wire import Trace

ROOT = Path(__file__).resolve().parents[2]
# The served context (serve.sh's --max-model-len), as the operator tells the trainer. Its
# worst case (two 4K-token traces a pass) needs more memory than a CI machine has; these
# traces are a few dozen tokens: the plan is made and logged, not enforced.
PLAN_AS_CI_CAN = {"maxSequenceTokens": 4096, "memoryPlan": "Warn"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    models = os.environ.get("FLOE_TEST_MODELS")
    assert models, "FLOE_TEST_MODELS must name the converted models (scripts/vllm-cpu/setup.sh)"
    model_dir = tmp_path_factory.mktemp("policy") / "smollm2"
    shutil.copytree(Path(models) / "smollm2-135m-instruct", model_dir)
    as_shipped(model_dir)
    # As the operator and `floe run` start it (trainer_launch::vllm_args): the behaviour
    # log-probs are of the distribution sampled from, temperature applied.
    with running(model_dir, "--logprobs-mode", "processed_logprobs") as url:
        yield url, model_dir


def chat_prompt(model_dir, question: str) -> list[int]:
    """The token ids of ``question`` as a one-message chat, ready for the reply."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def test_at_a_sampling_temperature_the_trainer_weighs_tokens_as_vllm_drew_them(served):
    url, model_dir = served
    prompt = chat_prompt(model_dir, "Name a river.")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gaps = {0.6: [], 1.0: []}
    for c in sample(url, prompt, 4, seed=3, max_tokens=12, temperature=0.6):
        ids = c["token_ids"]
        trace = Trace(prompt, ids, [1] * len(ids), [None] * len(ids))
        behaviour = c["logprobs"]["token_logprobs"]
        for t, out in gaps.items():
            with torch.no_grad():
                mine = token_logprobs(model, make_batch([trace], temperature=t))[0].tolist()
            out.append(max(abs(a - b) for a, b in zip(mine, behaviour, strict=True)))
    print(
        f"\nat T=0.6: trainer vs vLLM max |Δ| {max(gaps[0.6]):.2e}; untempered {max(gaps[1.0]):.3f}"
    )
    assert max(gaps[0.6]) < 1e-3
    # The untempered policy is not the one that drew them: a trainer that ignored the
    # temperature (or a vLLM reporting raw log-probs) would weigh every token wrongly.
    assert max(gaps[1.0]) > 1e-2


def as_shipped(model_dir: Path) -> None:
    """SmolLM2 as its GGUF ships it: the output head tied to the embedding (the cached test
    copy unties it for older tests; here the trainer must handle the tie itself)."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    state = load_file(str(model_dir / "model.safetensors"))
    head = state.pop("lm_head.weight")
    assert torch.equal(head, state["model.embed_tokens.weight"])
    save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def group_bodies(url, prompt, task, version=0):
    """A group of 4 sampled from vLLM; reward: shorter answers score higher (+ a tie-break)."""
    choices = sample(url, prompt, 4, seed=7, max_tokens=16)
    return [
        trajectory(
            f"j-{task}-{i}",
            f"j/{task}",
            i,
            prompt,
            c,
            1.0 - len(c["token_ids"]) / 16 + 0.01 * i,
            version,
        )
        for i, c in enumerate(choices)
    ]


def test_one_trained_step_is_exactly_what_vllm_serves_after_the_push(served):
    url, model_dir = served
    prompt = chat_prompt(model_dir, "Name a fruit.")
    bodies = group_bodies(url, prompt, "fruit")
    group = one_group(bodies)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "tied"
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
    # The samples share their prompt, so the step computed them in shared rows (prompt
    # sharing): its log-probs still match what vLLM sampled with.
    assert stats.computed_tokens < stats.trace_tokens
    assert stats.logprob_mismatch < 1e-3
    timing = push(model.state_dict, url, model_dir, 1)
    print(
        f"\nweight push: save {timing['save_seconds']:.2f} s,"
        f" paused {timing['paused_seconds']:.2f} s"
    )

    with torch.no_grad():
        after_trainer = token_logprobs(model, make_batch([trace]))[0].tolist()
    served_vs_trained, moved = served_against(url, probe, after_trainer, before_vllm)
    assert served_vs_trained < 2e-3, "vLLM serves the trained weights, tied head included"
    assert moved > 1e-2, "the push changed what vLLM serves"
    assert served_version(url) == 1, "the weights carry their policy version"


def logprobs_without_eos(model, prompt: list[int], ids: list[int]) -> list[float]:
    """Log-probs of ``ids`` after ``prompt`` in the distribution vLLM samples from under
    ``min_tokens``: the end of sequence masked out. vLLM reports that one (processed
    logprobs, as a train job's vLLM is started)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    logits = logits[len(prompt) - 1 : -1]
    logits[:, model.config.eos_token_id] = float("-inf")
    return logits.log_softmax(-1).gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1).tolist()


def complete(url, prompt, tokens, out):
    body = {
        "model": "policy",
        "prompt": prompt,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 1.0,
        "seed": 3,
        "logprobs": 0,
        "return_token_ids": True,
    }
    t0 = time.monotonic()
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        out["choice"] = json.loads(r.read())["choices"][0]
    out["seconds"] = time.monotonic() - t0
    out["done_at"] = time.monotonic()


def requests_running(url: str) -> float:
    """The sum of vLLM's ``vllm:num_requests_running`` series on its metrics page."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        page = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


def test_a_completion_running_across_a_push_finishes_on_the_weights_it_started_with(served):
    """vLLM's pause mode ``wait``: the push waits for the running completion, which is
    sampled entirely by the old weights (no mix of two policies, no aborted agent call)."""
    import threading

    url, model_dir = served
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    version = served_version(url)
    prompt = [1, 504, 3458, 282, 4600, 314]
    out: dict = {}
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in new.model.layers[0].parameters():
            p.mul_(1.05)
    save_weights(new, model_dir)
    caller = threading.Thread(target=complete, args=(url, prompt, 300, out))
    caller.start()
    # The push must find the completion in the engine, not still in the API server (a fixed
    # second was not always enough on a busy machine).
    deadline = time.monotonic() + 60
    running = requests_running(url)
    while running < 1 and "choice" not in out and time.monotonic() < deadline:
        time.sleep(0.05)
        running = requests_running(url)
    running_at_pause = running >= 1 and "choice" not in out
    # push() after its save: pause (wait) -> reload -> reset cache -> version -> resume.
    paused(
        url,
        version + 1,
        lambda: post(
            f"{url}/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}},
        ),
    )
    caller.join()
    assert running_at_pause, "the completion was still running when the push paused vLLM"
    choice = out["choice"]
    ids = choice["token_ids"]
    assert len(ids) == 300, "the completion was not cut short"
    assert served_version(url) == version + 1
    sampled = choice["logprobs"]["token_logprobs"]
    # ``min_tokens`` masks the end of sequence: that is the distribution sampled from.
    by_old = logprobs_without_eos(old, prompt, ids)
    by_new = logprobs_without_eos(new, prompt, ids)
    off_old = max(abs(a - b) for a, b in zip(sampled, by_old, strict=True))
    off_new = max(abs(a - b) for a, b in zip(sampled, by_new, strict=True))
    print(f"\nacross a push: |sampled - old| {off_old:.2e}, |sampled - new| {off_new:.2e}")
    assert off_old < 2e-3, "every token sampled by the weights the completion started with"
    assert off_new > 1e-2


def post_json(url, body, token=None):
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def test_the_loop_trains_pushes_checkpoints_and_resumes_without_losing_anything(served, tmp_path):
    import threading

    from floe_trainer.ingest import make_server
    from floe_trainer.trainer import Trainer, TrainerConfig

    url, model_dir = served
    # vLLM serves what this module's earlier tests pushed, labelled with their versions: a
    # trainer would go on past them (``test_resume.py``). This job's starts at version 0.
    paused_reload(url, model_dir)
    prompt = chat_prompt(model_dir, "Name a colour.")
    conf = {
        "model": str(model_dir),
        "policyUrl": url,
        "numSamples": 4,
        "grpo": {"groupsPerStep": 1, "learningRate": 1e-5, "microBatchSize": 2},
        "checkpoint": {"everySteps": 1, "keep": 2},
        # As in the pod with a checkpoint claim: acknowledged trajectories on durable storage.
        "ingestDir": str(tmp_path / "claim/ingest"),
        **PLAN_AS_CI_CAN,
    }

    def start():
        t = Trainer(TrainerConfig.from_operator(conf, tmp_path / "state"))
        srv = make_server(
            t.ingest,
            ("127.0.0.1", 0),
            t.status,
            t.metrics.render,
            finish=t.finish,
            control_token="t0ken",
        )
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
    served_lp = prompt_logprobs(url, "policy", probe)[-3:]
    assert max(abs(a - b) for a, b in zip(served_lp, mine_now(trainer, prompt), strict=True)) < 2e-3
    metrics = urllib.request.urlopen(f"{ingest}/metrics").read().decode()
    assert "floe_trainer_step 1.0" in metrics
    assert 'floe_trainer_step_phase_seconds_count{phase="sync"} 1.0' in metrics

    # Acknowledged but not yet trained when the trainer dies.
    for body in group_bodies(url, prompt, "shade"):
        assert post_json(f"{ingest}/v1/trajectories", body) == 200
    assert len(list((tmp_path / "claim/ingest").iterdir())) == 8, "kept where the job said"
    srv.shutdown()
    srv.server_close()
    del trainer

    trainer, srv, ingest = start()
    assert (trainer.state.step, trainer.state.policy_version) == (1, 1), "resumed at the checkpoint"
    assert served_version(url) == 1, "the checkpoint's weights pushed again at resume"
    assert list(trainer.buffer.pending) == ["j/shade"], "replayed: only what was not trained"
    status = trainer.status()
    assert status["resumedFromStep"] == 1
    assert [s["step"] for s in status["steps"]] == [1], "the step table spans restarts"
    assert status["groupsDone"] == 1, "so does the count the staleness gate reads"
    assert trainer.run_once() is not None
    assert (trainer.state.step, trainer.state.policy_version) == (2, 2)
    assert trainer.status()["groupsDone"] == 2
    assert [s["step"] for s in trainer.status()["steps"]] == [1, 2]
    trainer.save_checkpoint()  # a stop right after a periodic checkpoint writes nothing new
    assert sorted(p.name for p in (tmp_path / "state/checkpoints").glob("ckpt-*")) == [
        "ckpt-1",
        "ckpt-2",
    ]

    # A vLLM that restarted serves the base weights, labelled "default": the trainer notices
    # and pushes its own again.
    base = tmp_path / "base"
    shutil.copytree(ROOT_MODELS(), base)
    paused_reload(url, base)
    assert served_version(url) == 0
    trainer.check_policy_server(now=1e12)
    assert served_version(url) == 2 and trainer.repushes == 1
    served_lp = prompt_logprobs(url, "policy", probe)[-3:]
    assert max(abs(a - b) for a, b in zip(served_lp, mine_now(trainer, prompt), strict=True)) < 2e-3

    # The job's sessions are done: half a group is still pending; it is trained, then the
    # final checkpoint is a model directory with the tokenizer. No periodic checkpoint is due
    # at that last step, but the finish saves one (a trainer killed after it resumes there,
    # not from an older one that it would train on and write over final/).
    trainer.cfg.checkpoint_every = 100
    for body in group_bodies(url, prompt, "hue", version=2)[:2]:
        assert post_json(f"{ingest}/v1/trajectories", body) == 200
    assert trainer.run_once() is None, "half a group waits while more may come"
    assert post_json(f"{ingest}/v1/finish", {}, token="t0ken") == 202
    assert trainer.run_once() is not None, "the leftover half group makes the last step"
    assert trainer.run_once() is None and trainer.finished
    final = trainer.final_checkpoint
    assert final is not None and (final / "tokenizer.json").exists()
    assert (final / "chat_template.jinja").exists() and (final / "config.json").exists()
    status = json.loads(urllib.request.urlopen(f"{ingest}/v1/status").read())
    assert status["finished"] and [r["step"] for r in status["steps"]] == [1, 2, 3]
    saved_at_finish = (tmp_path / "state/checkpoints/ckpt-3/state.json").stat().st_mtime_ns
    trainer.save_checkpoint()  # what `floe-trainer serve` does when stopped: nothing new
    assert (tmp_path / "state/checkpoints/ckpt-3/state.json").stat().st_mtime_ns == saved_at_finish
    saved = json.loads((tmp_path / "state/checkpoints/ckpt-3/state.json").read_text())
    assert [r["step"] for r in saved["steps"]] == [1, 2, 3] and saved["policy_version"] == 3
    assert status["steps"][-1]["groups"] == 1 and status["steps"][-1]["sequences"] == 2
    reloaded = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    AutoTokenizer.from_pretrained(final).apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    with torch.no_grad():
        theirs = token_logprobs(
            reloaded, make_batch([Trace(prompt, [28, 29, 30], [1] * 3, [None] * 3)])
        )[0].tolist()
    assert max(abs(a - b) for a, b in zip(theirs, mine_now(trainer, prompt), strict=True)) < 1e-5
    srv.shutdown()


def mine_now(trainer, prompt):
    with torch.no_grad():
        return token_logprobs(
            trainer.model, make_batch([Trace(prompt, [28, 29, 30], [1] * 3, [None] * 3)])
        )[0].tolist()


def ROOT_MODELS() -> Path:  # noqa: N802
    return Path(os.environ["FLOE_TEST_MODELS"]) / "smollm2-135m-instruct"


def paused_reload(url: str, weights_dir: Path) -> None:
    """What a restarted vLLM serves: the base weights, with no version label."""
    paused(
        url,
        0,
        lambda: post(
            f"{url}/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}},
        ),
    )
    post(f"{url}/update_weight_version", {"new_version": "default"})


@pytest.mark.skipif(
    not os.environ.get("FLOE_TEST_LEARN_DEMO"),
    reason="learning is proven end to end in CI by examples/learn through floe run (harness, "
    "gateway, evaluator, trainer); set FLOE_TEST_LEARN_DEMO=1 for the trainer-only demo",
)
def test_it_learns_a_verifiable_toy_task(served):
    """GRPO on "answer briefly" (reward = 1 - tokens/24): a few steps on CPU raise the held-out
    mean reward well above the untrained policy's."""
    from floe_trainer.learn_demo import run

    url, model_dir = served
    baseline, final, curve = run(url, model_dir, steps=6)
    print("curve:", [round(r, 3) for _, r, _, _ in curve])
    assert final >= baseline + 0.3, (baseline, final, curve)


@pytest.mark.full(
    reason="tests/tests/real_node/training.rs runs train.nodes 2 in real trainer pods (FSDP2 over "
    "gloo, vLLM pushes, a deleted pod's successor resuming, every trajectory trained once); "
    "test_distributed.py checks two processes' step equals one process's"
)
def test_two_nodes_train_a_step_vllm_serves_and_resume_from_the_first_ones_checkpoint(
    served, tmp_path
):
    """``floe-trainer serve`` as two nodes of one process each (``train.nodes: 2`` on CPU:
    two torchruns joined by a static rendezvous at the first, as the operator starts its
    pods; gloo, FSDP2), each with a state directory of its own, as pods have: the first
    serves the ingest and leads; the step's weights (gathered from both shards) are what one
    process would have trained, and what vLLM serves after the push. A SIGTERM to the first
    alone (its pod deleted) leaves a checkpoint both gathered, and the second, told to stop,
    ends cleanly. Two new nodes resume: the second, whose directory has no checkpoint, takes
    the weights and AdamW state from the first."""
    from safetensors.torch import load_file

    from floe_trainer.trainer import TrainerConfig, loss_config, step_options

    url, model_dir = served
    prompt = chat_prompt(model_dir, "Name a tree.")
    port = free_port()
    conf = {
        "model": str(model_dir),
        "policyUrl": url,
        "numSamples": 4,
        "gpus": 0,
        "nodes": 2,
        "ingestListen": f"127.0.0.1:{port}",
        "grpo": {
            "groupsPerStep": 1,
            "learningRate": 1e-5,
            "microBatchSize": 1,
            "miniBatches": 2,
        },
        "checkpoint": {"everySteps": 100, "keep": 2},
        **PLAN_AS_CI_CAN,
    }
    state = tmp_path / "state"
    ingest = f"http://127.0.0.1:{port}"

    def node(rank: int, rendezvous: int):
        """One pod's torchrun, with the arguments the operator gives it (trainer_launch.rs)."""
        log = open(tmp_path / f"node{rank}.log", "a")  # noqa: SIM115 (as long as the process)
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={rank}"]
            + ["--master-addr=127.0.0.1", f"--master-port={rendezvous}", "--nproc-per-node=1"]
            + ["-m", "floe_trainer.cli", "serve"]
            + ["--state-dir", str(state if rank == 0 else tmp_path / f"state-node{rank}")],
            env={
                **os.environ,
                "FLOE_TRAINER_CONFIG": json.dumps(conf),
                "PYTHONPATH": os.pathsep.join([str(ROOT / "trainer"), *sys.path]),
                "OMP_NUM_THREADS": "1",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=ending_with_pytest(),
        )

    def logs() -> str:
        return "".join((tmp_path / f"node{r}.log").read_text()[-3000:] for r in (0, 1))

    def start():
        rendezvous = free_port()
        procs = [node(0, rendezvous), node(1, rendezvous)]
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{ingest}/healthz", timeout=2)
                return procs
            except OSError:
                assert all(p.poll() is None for p in procs), logs()
                assert time.monotonic() < deadline, logs()
                time.sleep(1)

    def status():
        return json.loads(urllib.request.urlopen(f"{ingest}/v1/status", timeout=10).read())

    def kill(procs):
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)

    def stop(procs):
        first, second = procs
        first.send_signal(signal.SIGTERM)  # what the kubelet sends the first pod's PID 1
        try:
            # torchrun ends 1 on a signal once its processes have; the second's ends once the
            # leader told its process to stop (then 1 too: the rendezvous store it shared went
            # with the first). Within the time each is given, or the checkpoint below is not
            # what they wrote.
            first.wait(timeout=120)
            second.wait(timeout=60)
        finally:
            kill(procs)

    bodies = group_bodies(url, prompt, "tree")
    procs = start()
    try:
        for body in bodies:
            assert post_json(f"{ingest}/v1/trajectories", body) == 200
        deadline = time.monotonic() + 300
        while status()["step"] < 1:
            assert all(p.poll() is None for p in procs), logs()
            assert time.monotonic() < deadline, "no step in 300 s"
            time.sleep(1)
        assert status()["policyVersion"] == 1 and served_version(url) == 1
        assert status()["memoryPlan"]["items"]["gathered layers"] > 0, "planned as sharded"
        stop(procs)
    finally:
        kill(procs)

    # The same step in this one process.
    cfg = TrainerConfig.from_operator(conf, tmp_path / "unused")
    group = one_group(bodies)
    start_weights = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    train_step(model, opt, [group], loss_config(cfg), seed=0, **step_options(cfg))
    pushed = load_file(str(state / "weights/model.safetensors"))
    mine = model.state_dict()
    base = start_weights.state_dict()
    diff = sum(float(((pushed[k] - base[k]) - (mine[k] - base[k])).pow(2).sum()) for k in mine)
    norm = sum(float((mine[k] - base[k]).pow(2).sum()) for k in mine)
    assert norm > 0 and (diff / norm) ** 0.5 <= 1e-3, (diff / norm) ** 0.5
    probe = prompt + [28, 29, 30]
    served_lp = prompt_logprobs(url, "policy", probe)[-3:]
    with torch.no_grad():
        ours = token_logprobs(
            model, make_batch([Trace(prompt, [28, 29, 30], [1] * 3, [None] * 3)])
        )[0].tolist()
    assert max(abs(a - b) for a, b in zip(served_lp, ours, strict=True)) < 2e-3
    # Two processes resume next, each loading the weights and the whole AdamW state: this
    # test's own copies (3 GB) go first, or a CI machine beside vLLM runs short of memory.
    del start_weights, model, opt, pushed, mine, base
    gc.collect()

    # Stopped: the checkpoint both processes gathered (weights and AdamW state), on the first
    # node only; then resumed.
    ckpt = state / "checkpoints/ckpt-1"
    assert (ckpt / "optimizer.pt").exists() and (ckpt / "model.safetensors").exists()
    assert not list((tmp_path / "state-node1").glob("**/ckpt-*")), "the second writes none"
    procs = start()
    try:
        now = status()
        assert (now["step"], now["policyVersion"], now["resumedFromStep"]) == (1, 1, 1)
        assert served_version(url) == 1
        # The resumed world pushed what it holds, gathered from both shards: the checkpoint's
        # weights exactly (the second node's half came from the first by broadcast).
        pushed = load_file(str(state / "weights/model.safetensors"))
        saved = load_file(str(ckpt / "model.safetensors"))
        common = pushed.keys() & saved.keys()
        assert len(common) > 100, sorted(pushed)[:5]
        assert all(torch.equal(pushed[k], saved[k]) for k in common)
        del pushed, saved
        stop(procs)
    finally:
        kill(procs)
