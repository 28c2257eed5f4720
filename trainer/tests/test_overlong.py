"""``grpo.overlong: Mask`` through the trainer itself: from the job's config and the wire's
``stats.overlong_turns`` to a step that keeps the overlong session's reward in its group's
baseline and none of its tokens in the loss."""

import json
import re
from pathlib import Path

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


def _ingest_lengths(trainer, rewards, longest):
    for i, (reward, n) in enumerate(zip(rewards, longest, strict=True)):
        ids = [5 + i, 6, 7]
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
        t = trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, reward, 0)
        t["stats"] = {"longest_turn_tokens": n}
        assert trainer.ingest.handle(json.dumps(t).encode())[0] == 200


def test_the_overlong_penalty_shapes_the_advantage_not_the_reward(tmp_path):
    # DAPO's soft punishment: a cap of 16 tokens, the last 8 a buffer. Both sessions passed;
    # one stayed clear of the buffer, the other ran to the cap (penalty 1). Under MeanOnly the
    # advantages keep the penalty's own scale: the two passes train towards the shorter.
    penalty = {"bufferTokens": 8, "factor": 1.0}
    trainer = tiny_trainer(
        tmp_path,
        2,
        config={"maxResponseTokens": 16},
        overlongPenalty=penalty,
        advantage="MeanOnly",
    )
    _ingest_lengths(trainer, (1.0, 1.0), (8, 16))
    stats = trainer.run_once()
    assert stats is not None, "two passes of different lengths teach something"
    assert (stats.penalized_sessions, stats.overlong_penalty_mean) == (1, 0.5)
    # What the sessions earned is unchanged: the reward curve and pass rate read it.
    assert stats.reward_mean == 1.0
    row = trainer.status()["steps"][-1]
    assert (row["penalizedSessions"], row["overlongPenalty"], row["passRate"]) == (1, 0.5, 1.0)
    assert trainer.metrics.overlong_penalty._value.get() == 0.5
    assert trainer.state.policy_version == 1


def test_under_mean_std_penalties_alone_never_make_a_group_of_passes_teach(tmp_path):
    # Dividing by the std of penalties alone would make the session a little into the buffer
    # a full failure; DAPO filters such a group on accuracy, and so does floe.
    penalty = {"bufferTokens": 8, "factor": 1.0}
    trainer = tiny_trainer(tmp_path, 2, config={"maxResponseTokens": 16}, overlongPenalty=penalty)
    _ingest_lengths(trainer, (1.0, 1.0), (8, 9))
    assert trainer.run_once() is None
    assert trainer.buffer.dropped["zero_advantage"] == 1


def test_without_the_penalty_passes_of_any_length_teach_nothing(tmp_path):
    trainer = tiny_trainer(tmp_path, 2, config={"maxResponseTokens": 16})
    _ingest_lengths(trainer, (1.0, 1.0), (8, 16))
    assert trainer.run_once() is None
    assert trainer.buffer.dropped["zero_advantage"] == 1


@pytest.mark.parametrize(
    ("config", "penalty", "error"),
    [
        ({"maxResponseTokens": 16}, {"bufferTokens": 17}, "1..maxResponseTokens (16)"),
        ({}, {"bufferTokens": 8}, "1..maxResponseTokens (None)"),
        ({"maxResponseTokens": 16}, {"bufferTokens": 0}, "got 0"),
        ({"maxResponseTokens": 16}, {"bufferTokens": 8, "factor": -1}, "factor must be >= 0"),
    ],
)
def test_an_overlong_penalty_the_cap_cannot_hold_is_refused(config, penalty, error):
    from floe_trainer.trainer import TrainerConfig

    conf = {"model": "m", "numSamples": 2, "grpo": {"overlongPenalty": penalty}, **config}
    with pytest.raises(ValueError, match=re.escape(error)):
        TrainerConfig.from_operator(conf, Path("/nonexistent"))
