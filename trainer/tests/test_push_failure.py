"""A weight push that cannot reach vLLM (its container stopping with the pod, or restarting)
or that vLLM fails now (a 5xx) does not end the trainer: the step stands, a stop checkpoints
it, and it is pushed again later. A push vLLM refuses for good (another 4xx) ends it."""

import io
import urllib.error

import pytest
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
    # Its group is neither trained nor vanished: counted among the drops.
    assert trainer.status()["dropped"] == {"no_update": 1}
    # A stop checkpoints the groups it took, though no step counted: a restart replayed them
    # and ran the same doomed step again.
    trainer.save_checkpoint()
    import json

    saved = json.loads((tmp_path / "state/checkpoints/ckpt-0/state.json").read_text())
    assert sorted(saved["trained_sessions"]) == ["s-0", "s-1"]
    assert saved["groups_done"] == 1


def http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("http://vllm/update", code, "failed", {}, io.BytesIO(b""))


def two_samples(trainer) -> None:
    for i, ids in enumerate(([5, 6, 7], [8, 9])):
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
        trainer.add(parse(trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, float(i), 0)))


def test_a_step_whose_push_vllm_fails_with_a_5xx_stands_and_is_pushed_again(tmp_path, monkeypatch):
    # vLLM's engine died mid-push: a 500. It ended the trainer, the step neither counted nor
    # checkpointed, so a restart went back to the last periodic checkpoint (every 50 steps).
    trainer = tiny_trainer(tmp_path, 2, learningRate=1e-3, microBatchSize=2)
    pushed: list[int] = []

    def failing(version: int):
        pushed.append(version)
        raise http_error(500)

    monkeypatch.setattr(trainer.sync, "push", failing)
    two_samples(trainer)
    assert trainer.run_once() is not None, "the step ran"
    assert (trainer.state.step, trainer.state.policy_version) == (1, 1)
    trainer.save_checkpoint()
    assert (tmp_path / "state/checkpoints/ckpt-1/state.json").is_file()
    # The check that finds vLLM serving other weights pushes again; its failing push waits for
    # the next check instead of ending the trainer.
    monkeypatch.setattr("floe_trainer.trainer.served_label", lambda url: "default")
    trainer.check_policy_server(now=1e12)
    assert pushed == [1, 1]
    assert trainer.repushes == 0
    # What vLLM serves, beside the trainer's own version: a push that did not reach it shows.
    assert trainer.metrics.served_version._value.get() == 0
    assert trainer.metrics.version._value.get() == 1


@pytest.mark.parametrize("code", [400, 404])
def test_a_push_vllm_refuses_for_good_ends_the_trainer(tmp_path, monkeypatch, code):
    trainer = tiny_trainer(tmp_path, 2, learningRate=1e-3, microBatchSize=2)

    def refused(version: int):
        raise http_error(code)

    monkeypatch.setattr(trainer.sync, "push", refused)
    two_samples(trainer)
    with pytest.raises(urllib.error.HTTPError):
        trainer.run_once()


def test_a_push_whose_resume_failed_leaves_no_vllm_paused(tmp_path):
    # The label moved before vLLM's resume failed: the served-version check saw nothing amiss
    # and generation stayed paused for good, every agent's call waiting until it timed out.
    from fake_vllm import FakeVllm

    vllm = FakeVllm(fail_on="/resume", failures=1)
    try:
        trainer = tiny_trainer(tmp_path, 2, {"policyUrl": vllm.url}, microBatchSize=2)
        two_samples(trainer)
        assert trainer.run_once() is not None, "the step stands"
        assert vllm.label == "1" and vllm.paths()[-1] == "/resume"
        resumes = vllm.paths().count("/resume")
        trainer.check_policy_server(now=1e12)
        assert vllm.paths().count("/resume") == resumes + 1, "resumed by the next check"
        assert "/collective_rpc" not in vllm.paths()[-1:], "the weights are not pushed again"
        trainer.check_policy_server(now=2e12)
        assert vllm.paths().count("/resume") == resumes + 1, "and only once"
    finally:
        vllm.close()


@pytest.mark.parametrize(
    "failing", ["/collective_rpc", "/reset_prefix_cache", "/update_weight_version"]
)
def test_a_push_that_failed_after_the_reload_resets_the_cache_and_is_pushed_again(
    tmp_path, failing
):
    # The new weights in, or half of them (a reload failing part-way), the cache reset or the
    # label failed: vLLM resumed with a prefix cache of the old weights serving the new ones.
    # The cache is reset all the same; the old label lasts until the next check pushes again.
    from fake_vllm import FakeVllm

    vllm = FakeVllm(fail_on=failing, failures=1)
    try:
        trainer = tiny_trainer(tmp_path, 2, {"policyUrl": vllm.url}, microBatchSize=2)
        two_samples(trainer)
        assert trainer.run_once() is not None, "the step stands"
        paths = vllm.paths()
        reload = paths.index("/collective_rpc")
        assert paths[-1] == "/resume" and vllm.label == "default"
        # A reset answered after the reload (the failing path fails once only).
        resets = paths[reload:].count("/reset_prefix_cache") - (failing == "/reset_prefix_cache")
        assert resets >= 1, paths
        trainer.check_policy_server(now=1e12)
        assert vllm.label == "1", "pushed again"
        assert vllm.paths()[-1] == "/resume"
    finally:
        vllm.close()
