"""``grpo.overlong: Mask`` through the trainer itself: from the job's config and the wire's
``stats.overlong_turns`` to a step that keeps the overlong session's reward in its group's
baseline and none of its tokens in the loss."""

import json

import pytest
from tiny import tiny_trainer

from floe_trainer.checkpoint import State
from floe_trainer.learn_demo import trajectory


@pytest.mark.parametrize(("overlong", "masked"), [("Train", 0), ("Mask", 1)])
def test_an_overlong_session_is_masked_only_when_the_job_says_so(tmp_path, overlong, masked):
    trainer = tiny_trainer(tmp_path, 3, overlong=overlong)
    for i, reward in enumerate((1.0, 0.0, 0.0)):
        ids = [5 + i, 6, 7]
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
        t = trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, reward, 0)
        t["stats"] = {"truncated_turns": 2, "overlong_turns": 1 if i == 1 else 0}
        assert trainer.ingest.handle(json.dumps(t).encode())[0] == 200
    stats = trainer.run_once()
    assert stats is not None
    assert (stats.sessions, stats.overlong_sessions, stats.masked_sessions) == (3, 1, masked)
    assert stats.sequences == 3 - masked
    # The group's baseline is the three rewards either way: 1 above a mean of 1/3.
    assert stats.reward_mean == pytest.approx(1 / 3)
    row = trainer.status()["steps"][-1]
    assert (row["overlongSessions"], row["maskedSessions"]) == (1, masked)
    assert trainer.state.policy_version == 1
    [sampled] = trainer.sampled_by_version()
    assert sampled["overlongFraction"] == pytest.approx(1 / 3)
    # A checkpoint from before the count: its rows read as none overlong, then count on.
    trainer.state = State(sampled={"7": [2.0, 1.0, 1.0]})
    assert trainer.sampled_by_version()[-1]["overlongFraction"] == 0.0
    assert trainer.metrics.overlong._value.get() == pytest.approx(1 / 3)


def test_a_step_with_nothing_to_train_pushes_no_new_version(tmp_path):
    trainer = tiny_trainer(tmp_path, 2)
    for i, reward in enumerate((1.0, 0.0)):
        choice = {"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, -1.0]}}
        t = trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, reward, 0)
        t["traces"][0]["loss_mask"] = [0, 0]  # nothing the policy sampled, say
        assert trainer.ingest.handle(json.dumps(t).encode())[0] == 200
    stats = trainer.run_once()
    assert stats is not None and (stats.updates, stats.sequences) == (0, 0)
    assert (trainer.state.step, trainer.state.policy_version) == (0, 0)
    assert trainer.state.groups_done == 1
