"""A trainer restarted from its checkpoint (its container killed, the pod's vLLM going on)
forgets nothing a group needs: groups closed stay closed, samples reported failed stay
failed, and a policy version vLLM served past the checkpoint never names other weights."""

from __future__ import annotations

import json

import pytest
from fake_vllm import FakeVllm
from tiny import tiny_llama

from floe_trainer.learn_demo import trajectory
from floe_trainer.trainer import Trainer, TrainerConfig


@pytest.fixture
def vllm():
    server = FakeVllm()
    yield server
    server.close()


def start(tmp_path, vllm, **conf) -> Trainer:
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        tiny_llama().save_pretrained(model_dir)
    base = {
        "model": str(model_dir),
        "policyUrl": vllm.url,
        "numSamples": 4,
        "grpo": {
            "groupsPerStep": 1,
            "learningRate": 1e-3,
            "microBatchSize": 4,
            "minGroupFraction": 0.5,
            "groupGraceSeconds": 0,
        },
        "device": "cpu",
        "memoryPlan": "Warn",
    }
    return Trainer(TrainerConfig.from_operator({**base, **conf}, tmp_path / "state"))


def send(trainer: Trainer, group: str, sample: int, reward: float, version: int = 0) -> None:
    """A trajectory as the ingest takes it: stored (a restart replays it), then added."""
    ids = [5 + sample, 6, 7]
    choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
    body = trajectory(
        f"{group.replace('/', '-')}-{sample}", group, sample, [1, 2, 3], choice, reward, version
    )
    code, answer = trainer.ingest.handle(json.dumps(body).encode())
    assert code == 200, answer


def test_a_late_sample_of_a_group_trained_before_the_checkpoint_stays_late(tmp_path, vllm):
    trainer = start(tmp_path, vllm)
    send(trainer, "j/a", 0, 0.0)
    send(trainer, "j/a", 1, 1.0)
    assert trainer.run_once() is not None, "half the group after its grace: trained"
    send(trainer, "j/a", 2, 0.0)
    send(trainer, "j/a", 3, 1.0)
    assert trainer.buffer.dropped["late"] == 2
    trainer.save_checkpoint()

    again = start(tmp_path, vllm)
    assert again.state.step == 1
    assert again.run_once() is None, "the stragglers are no group of their own"
    assert not again.buffer.pending
    assert again.status()["groupsDone"] == 1


def test_a_group_dropped_before_the_checkpoint_is_not_counted_again(tmp_path, vllm):
    trainer = start(tmp_path, vllm, numSamples=2)
    send(trainer, "j/a", 0, 1.0)
    send(trainer, "j/a", 1, 1.0)  # all passed: nothing to learn
    send(trainer, "j/b", 0, 0.0)
    send(trainer, "j/b", 1, 1.0)
    assert trainer.run_once() is not None
    assert trainer.state.groups_done == 2
    sampled = trainer.sampled_by_version()
    trainer.save_checkpoint()

    again = start(tmp_path, vllm, numSamples=2)
    assert again.run_once() is None
    assert again.state.groups_done == 2, "the dropped group is done once"
    assert again.sampled_by_version() == sampled, "no session counted twice"


def test_a_failed_sample_reported_before_the_checkpoint_still_completes_its_group(tmp_path, vllm):
    # All samples needed, a long grace: only the failure report lets the group go.
    conf = {
        "numSamples": 3,
        "grpo": {"groupsPerStep": 1, "microBatchSize": 4, "groupGraceSeconds": 3600},
    }
    trainer = start(tmp_path, vllm, **conf)
    # A step first, so that there is a checkpoint to resume from.
    for s, r in enumerate((0.0, 1.0, 1.0)):
        send(trainer, "j/first", s, r)
    assert trainer.run_once() is not None
    trainer.sample_failed("j/a", 2)
    send(trainer, "j/a", 0, 0.0)
    assert trainer.run_once() is None
    trainer.save_checkpoint()

    again = start(tmp_path, vllm, **conf)
    send(again, "j/a", 1, 1.0)
    stats = again.run_once()
    assert stats is not None and stats.sequences == 2, "trained without the failed sample"


def checkpointed_at_version_1(tmp_path, vllm) -> Trainer:
    """A trainer (groups of 2, staleness 1) that took a step and checkpointed it."""
    trainer = start(tmp_path, vllm, numSamples=2, maxStaleness=1)
    send(trainer, "j/a", 0, 0.0)
    send(trainer, "j/a", 1, 1.0)
    assert trainer.run_once() is not None
    trainer.save_checkpoint()
    assert vllm.label == "1"
    return trainer


def test_versions_vllm_served_past_the_checkpoint_are_never_reused(tmp_path, vllm):
    checkpointed_at_version_1(tmp_path, vllm)
    # The trainer went on to versions 2 and 3, then died before its next checkpoint.
    vllm.label = "3"

    again = start(tmp_path, vllm, numSamples=2, maxStaleness=1)
    assert again.state.policy_version == 4, "on from the version after the last served"
    assert vllm.label == "4", "the checkpoint's weights pushed as version 4"
    # Samples of the lost weights are stale; those of the checkpoint's (version 1) are one
    # update behind at most, as version 4's weights are version 1's.
    send(again, "j/lost", 0, 0.0, version=3)
    send(again, "j/lost", 1, 1.0, version=2)
    send(again, "j/kept", 0, 0.0, version=1)
    send(again, "j/kept", 1, 1.0, version=4)
    stats = again.run_once()
    assert stats is not None and stats.sequences == 2
    assert again.buffer.dropped["stale"] == 2
    assert again.state.policy_version == 5
    again.save_checkpoint()

    third = start(tmp_path, vllm, numSamples=2, maxStaleness=1)
    assert third.buffer.lost == [(2, 3)], "the lost versions are remembered"
    assert third.state.policy_version == 5 and vllm.label == "5"


def test_a_trainer_without_a_checkpoint_skips_what_vllm_served_before_it(tmp_path, vllm):
    """It died before its first checkpoint: vLLM still serves its version 2."""
    vllm.label = "2"
    trainer = start(tmp_path, vllm, numSamples=2)
    assert trainer.state.policy_version == 3
    assert vllm.label == "3", "the base weights pushed again, as version 3"
    assert trainer.buffer.lag(0, 3) == 0, "version 3 is version 0's weights"


def test_versions_pushed_past_the_checkpoint_are_never_reused_when_vllm_restarted_too(
    tmp_path, vllm
):
    """The trainer pod deleted: its vLLM restarts with it and serves the base weights,
    saying nothing of versions 2 and 3. The trainer's own record of its pushes does."""
    trainer = checkpointed_at_version_1(tmp_path, vllm)
    for group in ("j/b", "j/c"):
        send(trainer, group, 0, 0.0, version=1)
        send(trainer, group, 1, 1.0, version=1)
    # Versions 2 and 3 pushed (sessions sampled them), then the pod went.
    assert trainer.run_once() is not None and trainer.run_once() is not None
    assert vllm.label == "3"
    vllm.label = "default"

    again = start(tmp_path, vllm, numSamples=2, maxStaleness=1)
    assert again.state.policy_version == 4, "on from the version after the last pushed"
    assert vllm.label == "4", "the checkpoint's weights pushed as version 4"
    # A late sample of version 3's weights, which no longer exist, is stale, not fresh.
    send(again, "j/late", 0, 0.0, version=3)
    send(again, "j/late", 1, 1.0, version=3)
    # (The groups trained after the checkpoint are trained again from it: replayed.)
    steps = [again.run_once() for _ in range(4)]
    assert sum(s is not None for s in steps) == 2
    assert again.buffer.dropped["stale"] == 2


def test_a_failed_sample_reported_after_the_checkpoint_survives_a_crash(tmp_path, vllm):
    # The ruling is told once (the operator forgets it at the 202): a trainer killed before
    # its next checkpoint waited for that sample until the job's end.
    conf = {
        "numSamples": 3,
        "grpo": {"groupsPerStep": 1, "microBatchSize": 4, "groupGraceSeconds": 3600},
    }
    trainer = start(tmp_path, vllm, **conf)
    send(trainer, "j/a", 0, 0.0)
    trainer.sample_failed("j/a", 2)
    # Killed: no checkpoint at all.

    again = start(tmp_path, vllm, **conf)
    send(again, "j/a", 1, 1.0)
    stats = again.run_once()
    assert stats is not None and stats.sequences == 2, "trained without the failed sample"
    again.save_checkpoint()
    assert not list((tmp_path / "state/ingest/failed").glob("*.json")), (
        "a closed group's failures are forgotten once a checkpoint keeps it closed"
    )


def test_a_restart_reads_no_trajectory_of_a_group_closed_at_the_checkpoint(
    tmp_path, vllm, monkeypatch
):
    # A long run keeps every trajectory it was sent: a restart parsed them all into memory
    # before serving, so it grew with the run until it could not come back at all.
    trainer = start(tmp_path, vllm, numSamples=2)
    send(trainer, "j/a", 0, 0.0)
    send(trainer, "j/a", 1, 1.0)  # trained
    send(trainer, "j/b", 0, 1.0)
    send(trainer, "j/b", 1, 1.0)  # all passed: dropped
    assert trainer.run_once() is not None
    send(trainer, "j/c", 0, 0.0)  # open at the checkpoint
    trainer.save_checkpoint()
    send(trainer, "j/c", 1, 1.0)  # after it

    from floe_trainer import ingest

    read: list[str] = []
    real = ingest.wire.parse

    def parse(body):
        read.append(body["session"])
        return real(body)

    monkeypatch.setattr(ingest.wire, "parse", parse)
    again = start(tmp_path, vllm, numSamples=2)
    assert sorted(read) == ["j-c-0", "j-c-1"]
    stats = again.run_once()
    assert stats is not None and stats.sequences == 2, "the open group trains"
    assert again.state.groups_done == 3


def test_a_stored_trajectory_that_cannot_be_read_is_left_out_and_counted(tmp_path, vllm):
    trainer = start(tmp_path, vllm, numSamples=2)
    send(trainer, "j/a", 0, 0.0)
    send(trainer, "j/a", 1, 1.0)
    (tmp_path / "state/ingest/j-a-1.json").write_text('{"torn": ')

    again = start(tmp_path, vllm, numSamples=2)
    assert again.ingest.counts["invalid"] == 1, "a lost session"
    assert again.metrics.replay_unreadable._value.get() == 1, "FloeTrainerSessionsLost"
    assert list(again.buffer.pending["j/a"].by_sample) == [0]


def test_a_stored_trajectory_a_stricter_trainer_refuses_completes_its_group_without_it(
    tmp_path, vllm
):
    # Every sample waited for: one that will never come again (its gateway was answered)
    # must count as gone, or its group waits for the job's end.
    grpo = {"groupsPerStep": 1, "learningRate": 1e-3, "microBatchSize": 4, "minGroupFraction": 1.0}
    trainer = start(tmp_path, vllm, numSamples=3, grpo=grpo)
    for group in ("j/a", "j/b"):
        for sample, reward in [(0, 0.0), (1, 1.0), (2, 1.0)]:
            send(trainer, group, sample, reward)
    for session, trainable in [("j-a-2", True), ("j-b-2", False)]:
        stored = tmp_path / f"state/ingest/{session}.json"
        body = json.loads(stored.read_text())
        body["traces"] = "not traces"  # what a stricter trainer refuses, its sample still named
        if not trainable:
            # An infrastructure failure's: its sample runs again, so its group waits for it.
            body.update(trainable=False, reward=None)
        stored.write_text(json.dumps(body))

    again = start(tmp_path, vllm, numSamples=3, grpo=grpo)
    assert again.ingest.counts["invalid"] == 2
    stats = again.run_once()
    assert stats is not None and stats.sessions == 2, "j/a trains without sample 2"
    assert list(again.buffer.pending) == ["j/b"], "j/b waits for its sample 2's next attempt"


def test_a_token_id_past_the_models_vocabulary_is_left_out_not_a_crash_on_every_replay(
    tmp_path, vllm
):
    # Taken, it would fail the step it is in (a device assert on a GPU), and then every replay
    # after a restart: the trainer would never train again.
    grpo = {"groupsPerStep": 1, "learningRate": 1e-3, "microBatchSize": 4}
    # Every sample waited for: the group completes only if the one left out counts as gone.
    trainer = start(tmp_path, vllm, grpo={**grpo, "minGroupFraction": 1.0})
    assert trainer.vocab_rows is not None
    body = trajectory(
        "g-0",
        "j/g",
        0,
        [1, 2, trainer.vocab_rows],
        {"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, -1.0]}},
        1.0,
    )
    assert trainer.ingest.handle(json.dumps(body).encode())[0] == 200
    assert trainer.buffer.dropped["out_of_vocabulary"] == 1
    # Its group does not wait for it: the rest of it trains.
    for sample, reward in [(1, 1.0), (2, 0.0), (3, 0.0)]:
        send(trainer, "j/g", sample, reward)
    assert trainer.run_once() is not None, "the group of the other three trained"
    assert "j/g" in trainer.buffer.closed


def test_sessions_replayed_after_a_crash_are_not_counted_to_prometheus_again(tmp_path, vllm):
    # The killed trainer counted them as they came; its successor's counter starts at 0, so
    # counting them again would add them twice to every increase() over the restart.
    def counted(t: Trainer) -> float:
        for line in t.metrics.render().decode().splitlines():
            if line.startswith("floe_trainer_sampled_sessions_total "):
                return float(line.split()[1])
        raise AssertionError("no floe_trainer_sampled_sessions_total")

    trainer = start(tmp_path, vllm, numSamples=3)
    send(trainer, "j/a", 0, 1.0)
    send(trainer, "j/a", 1, 0.0)
    assert counted(trainer) == 2
    # Killed: no checkpoint at all.
    again = start(tmp_path, vllm, numSamples=3)
    assert counted(again) == 0
    # The status's curve still has them (it is rebuilt, not a counter).
    assert [r["sessions"] for r in again.sampled_by_version()] == [2]
    send(again, "j/a", 2, 1.0)
    assert counted(again) == 1, "what comes after the restart is counted"


def test_what_the_restore_and_replay_drop_again_is_not_counted_again(tmp_path, vllm):
    # The drops of the process that took them were counted to Prometheus then: a restart's
    # counter (from 0) that counted them again showed a burst of drops that never happened.
    every = {"groupsPerStep": 1, "minGroupFraction": 1.0}
    trainer = start(tmp_path, vllm, numSamples=3, grpo=every)
    send(trainer, "j/a", 0, 0.0)
    trainer.sample_failed("j/a", 1)  # kept by the checkpoint: its group is open
    trainer.save_checkpoint()
    trainer.sample_failed("j/b", 0)  # after it: its record replayed
    assert trainer.status()["dropped"] == {"failed": 2}

    again = start(tmp_path, vllm, numSamples=3, grpo=every)
    assert again.buffer.dropped["failed"] == 2, "both still failed"
    assert again.status()["dropped"] == {}
    again.sample_failed("j/c", 0)
    assert again.status()["dropped"] == {"failed": 1}
    again.run_once()  # the counter follows each round
    families = {m.name: m for m in again.metrics.registry.collect()}
    dropped = families["floe_trainer_dropped"].samples
    assert [s.value for s in dropped if s.labels["reason"] == "failed"] == [1]


def test_a_trainer_killed_after_it_finished_resumes_from_its_last_step_not_an_older_one(
    tmp_path, vllm
):
    # Periodic checkpoints every 10 steps: a one-process trainer that finished after step 2
    # and was then killed without its stop (no SIGTERM checkpoint) resumed from none (here) or
    # an older one, trained those weights on and wrote them over final/.
    trainer = start(tmp_path, vllm, checkpoint={"everySteps": 10})
    for step, group in enumerate(["j/a", "j/b"]):
        send(trainer, group, 0, 0.0)
        send(trainer, group, 1, 1.0)
        assert trainer.run_once() is not None, f"step {step + 1}"
    trainer.finish()
    assert trainer.run_once() is None and trainer.finished
    final = trainer.final_checkpoint
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    again = start(tmp_path, vllm, checkpoint={"everySteps": 10})
    assert (again.state.step, again.state.groups_done) == (2, 2)
    resumed = again.model.state_dict()
    assert all(resumed[k].equal(v) for k, v in weights.items()), "the final step's weights"
    again.finish()
    assert again.run_once() is None and again.finished
    assert again.final_checkpoint == final and again.state.step == 2


def test_a_learning_rate_changed_before_a_resume_is_the_one_that_trains(tmp_path, vllm):
    # The optimizer's restored state carried the learning rate it was saved with, and the
    # job's new one was silently ignored.
    trainer = start(tmp_path, vllm)
    send(trainer, "j/a", 0, 0.0)
    send(trainer, "j/a", 1, 1.0)
    assert trainer.run_once() is not None
    trainer.save_checkpoint()

    grpo = {
        "groupsPerStep": 1,
        "learningRate": 3e-4,
        "microBatchSize": 4,
        "minGroupFraction": 0.5,
        "groupGraceSeconds": 0,
    }
    again = start(tmp_path, vllm, grpo=grpo)
    assert again.state.step == 1
    assert [g["lr"] for g in again.optimizer.param_groups] == [3e-4] * len(
        again.optimizer.param_groups
    )
    assert any(again.optimizer.state.values()), "the moments were restored"
