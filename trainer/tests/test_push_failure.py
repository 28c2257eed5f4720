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


def test_a_step_whose_every_update_was_skipped_pushes_nothing_and_counts_them(
    tmp_path, monkeypatch
):
    # Every update's gradient norm not finite: the weights did not move, so no push and no new
    # version (which would spend the staleness its samples are allowed), but the skips count.
    import torch

    real_norm = torch.nn.utils.clip_grad_norm_

    def not_finite(params, max_norm, *a, **k):
        real_norm(params, max_norm, *a, **k)
        return torch.tensor(float("nan"))

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", not_finite)
    trainer = tiny_trainer(tmp_path, 2, learningRate=1e-3, microBatchSize=2, miniBatches=2)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    for i, ids in enumerate(([5, 6, 7], [8, 9])):
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
        trainer.add(parse(trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, float(i), 0)))
    stats = trainer.run_once()
    assert stats is not None and (stats.updates, stats.skipped_updates) == (0, 2)
    assert (trainer.state.step, trainer.state.policy_version) == (0, 0)
    assert trainer.state.groups_done == 1, "its group is not queued again"
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in before.items())
    assert trainer.metrics.skipped_updates._value.get() == 2
