"""A weight push that cannot reach vLLM (its container stopping with the pod, or restarting)
does not end the trainer: the step stands and a stop checkpoints it."""

import socket

from tiny import tiny_llama

from floe_trainer.learn_demo import trajectory
from floe_trainer.trainer import Trainer, TrainerConfig
from floe_trainer.wire import parse


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: a connection is refused
    return port


def test_a_step_whose_push_finds_no_vllm_stands_and_is_checkpointed(tmp_path):
    model_dir = tmp_path / "model"
    tiny_llama().save_pretrained(model_dir)
    conf = {
        "model": str(model_dir),
        "policyUrl": f"http://127.0.0.1:{closed_port()}",
        "numSamples": 2,
        "grpo": {"groupsPerStep": 1, "learningRate": 1e-3, "microBatchSize": 2},
        "device": "cpu",
        "memoryPlan": "Warn",
    }
    trainer = Trainer(TrainerConfig.from_operator(conf, tmp_path / "state"))
    for i, ids in enumerate(([5, 6, 7], [8, 9])):
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
        trainer.add(parse(trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, float(i), 0)))
    stats = trainer.run_once()
    assert stats is not None, "the step ran"
    assert (trainer.state.step, trainer.state.policy_version) == (1, 1)
    trainer.save_checkpoint()
    saved = tmp_path / "state/checkpoints/ckpt-1/state.json"
    assert saved.is_file(), "a stopping trainer still checkpoints the step"
