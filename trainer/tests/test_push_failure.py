"""A weight push that cannot reach vLLM (its container stopping with the pod, or restarting)
does not end the trainer: the step stands and a stop checkpoints it."""

from tiny import tiny_trainer

from floe_trainer.learn_demo import trajectory
from floe_trainer.wire import parse


def test_a_step_whose_push_finds_no_vllm_stands_and_is_checkpointed(tmp_path):
    trainer = tiny_trainer(tmp_path, 2, learningRate=1e-3, microBatchSize=2)
    for i, ids in enumerate(([5, 6, 7], [8, 9])):
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
        trainer.add(parse(trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, float(i), 0)))
    stats = trainer.run_once()
    assert stats is not None, "the step ran"
    assert (trainer.state.step, trainer.state.policy_version) == (1, 1)
    trainer.save_checkpoint()
    saved = tmp_path / "state/checkpoints/ckpt-1/state.json"
    assert saved.is_file(), "a stopping trainer still checkpoints the step"
