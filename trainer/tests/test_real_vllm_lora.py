"""LoRA against the real vLLM OpenAI server on CPU (SmolLM2-135M-Instruct, ``--enable-lora``,
runtime LoRA updating): the trainer pushes a no-op adapter before it is ready, trains one step
of the adapter on a group sampled through it, and vLLM then serves exactly the trained policy
under the adapter's name; the checkpoint holds the adapter and resumes; the job's end writes
the merged model, which computes what vLLM served. Needs FLOE_TEST_MODELS; never skips."""

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_server import running, served_against

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


def config(url: str, model_dir: Path, state: Path) -> TrainerConfig:
    conf = {
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
    return TrainerConfig.from_operator(conf, state)


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
