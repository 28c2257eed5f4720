"""A session that failed by the agent's own doing (its pod evicted for what it wrote) is a loss,
never a sample that vanishes: the ``interrupted`` trajectory its gateway shipped as the pod
stopped is scored 0 when the operator says so, and trains with its group. Without it a policy
that fills its disk when losing would see those losses left out of every group, and nothing
would push that behaviour down."""

import json
import socket

from tiny import tiny_llama

from floe_trainer.learn_demo import trajectory
from floe_trainer.trainer import Trainer, TrainerConfig


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def sample(session, index, reward, status="completed"):
    ids = [5 + index, 6, 7]
    choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
    t = trajectory(session, "j/t", index, [1, 2, 3], choice, reward, 0)
    if status == "interrupted":
        t.update(status="interrupted", trainable=False, reward=None)
    return json.dumps(t).encode()


def trainer_of(tmp_path) -> Trainer:
    model_dir = tmp_path / "model"
    tiny_llama().save_pretrained(model_dir)
    conf = {
        "model": str(model_dir),
        "policyUrl": f"http://127.0.0.1:{closed_port()}",
        "numSamples": 3,
        "grpo": {"groupsPerStep": 1, "learningRate": 1e-3, "microBatchSize": 4},
        "device": "cpu",
        "memoryPlan": "Warn",
    }
    return Trainer(TrainerConfig.from_operator(conf, tmp_path / "state"))


def test_an_evicted_agents_interrupted_session_is_scored_zero_and_trained(tmp_path):
    trainer = trainer_of(tmp_path)
    assert trainer.ingest.handle(sample("s-0", 0, 1.0))[0] == 200
    assert trainer.ingest.handle(sample("s-1", 1, None, "interrupted"))[0] == 200
    assert trainer.ingest.handle(sample("s-2", 2, 1.0))[0] == 200
    assert trainer.run_once() is None, "an interrupted session is no sample yet"
    assert trainer.buffer.dropped["untrainable"] == 1

    # Another session's trajectory, or another sample's, is not scored by this ruling.
    assert trainer.sample_failed("j/t", 2, "s-1", "evicted") == {"failed": True}
    # (that sample had come already: the group still waits for sample 1)
    assert trainer.run_once() is None
    got = trainer.sample_failed("j/t", 1, "s-1", "Container agent exceeded its local ephemeral")
    assert got == {"scored": 0.0, "session": "s-1"}
    stored = json.loads((tmp_path / "state/ingest/s-1.json").read_text())
    assert (stored["trainable"], stored["reward"], stored["status"]) == (True, 0.0, "interrupted")
    assert "ephemeral" in stored["evaluation"]["detail"]["agent_fault"]
    assert trainer.buffer.dropped["untrainable"] == 0

    stats = trainer.run_once()
    assert stats is not None, "the group trained, the agent's loss in it"
    assert stats.sessions == 3 and stats.sequences == 3
    assert stats.reward_mean == 2 / 3
    assert trainer.sampled_by_version() == [
        {"policyVersion": 0, "sessions": 3, "rewardMean": 2 / 3, "passRate": 2 / 3}
    ]


def test_without_a_trajectory_to_score_the_sample_fails_and_its_group_goes_on(tmp_path):
    trainer = trainer_of(tmp_path)
    trainer.ingest.handle(sample("s-0", 0, 1.0))
    trainer.ingest.handle(sample("s-2", 2, 0.0))
    # Its gateway could not ship it in the kubelet's grace period: nothing to score.
    assert trainer.sample_failed("j/t", 1, "s-1", "evicted") == {"failed": True}
    stats = trainer.run_once()
    assert stats is not None and stats.sessions == 2
    # A completed session's verdict is its own, whatever the ruling says.
    trainer.ingest.handle(sample("s-5", 0, 1.0).replace(b'"j/t"', b'"j/u"'))
    assert trainer.ingest.score_interrupted("s-5", "j/u", 0, "evicted") is None
