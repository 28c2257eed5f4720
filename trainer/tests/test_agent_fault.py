"""A session that failed by the agent's own doing (its pod evicted for what it wrote) is a loss,
never a sample that vanishes. The kubelet kills such a pod with no grace period, so its gateway
posts a snapshot of the session after every call (``POST /v1/partial``); when the operator rules
the failure the agent's, the last snapshot is scored the job's failure reward (default 0) and
trains with its group. Without it a policy that fills its disk when losing would see those
losses left out of every group, and nothing would push that behaviour down."""

import json
import threading
import urllib.error
import urllib.request

from tiny import tiny_trainer

from floe_trainer.ingest import make_server
from floe_trainer.learn_demo import trajectory


def sample(session, index, reward, calls=None, group="j/t"):
    """A trajectory; with ``calls``, a gateway's snapshot after that many calls."""
    ids = [5 + index, 6, 7]
    choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
    t = trajectory(session, group, index, [1, 2, 3], choice, reward, 0)
    if calls is not None:
        t.update(status="interrupted", trainable=False, reward=None, evaluation=None)
        t["stats"] = {"completions": calls}
    return json.dumps(t).encode()


def partial(trainer, session, index, calls):
    """A gateway's snapshot of ``session`` after ``calls`` calls, as its post brings it."""
    return trainer.ingest.handle_partial(session, str(calls), sample(session, index, None, calls))


def trainer_of(tmp_path):
    return tiny_trainer(tmp_path, 3, learningRate=1e-3)


def test_an_evicted_agents_last_snapshot_is_scored_zero_and_trained(tmp_path):
    trainer = trainer_of(tmp_path)
    assert trainer.ingest.handle(sample("s-0", 0, 1.0))[0] == 200
    assert trainer.ingest.handle(sample("s-2", 2, 1.0))[0] == 200
    # Session 1's calls, each posted as it happened; the second call's crossed the third's.
    for calls in (1, 3, 2):
        assert partial(trainer, "s-1", 1, calls)[0] == 200
    kept = json.loads((tmp_path / "state/ingest/partial/s-1.json").read_text())
    assert kept["stats"]["completions"] == 3, "the snapshot of the most calls is kept"
    assert trainer.run_once() is None, "a snapshot is no sample"
    assert trainer.ingest.counts["partial"] == 2

    # A ruling on another sample does not score this session's snapshot.
    assert trainer.sample_failed("j/t", 2, "s-1", "evicted") == {"failed": True}
    assert trainer.run_once() is None, "the group still waits for sample 1"
    got = trainer.sample_failed("j/t", 1, "s-1", "Container agent exceeded its local ephemeral")
    assert got == {"scored": 0.0, "session": "s-1"}
    # The operator tells a ruling until the trainer answers: told again, it changes nothing.
    again = trainer.sample_failed("j/t", 1, "s-1", "Container agent exceeded its local ephemeral")
    assert again == {"known": True, "session": "s-1"}
    assert trainer.buffer.dropped["failed"] == 0
    stored = json.loads((tmp_path / "state/ingest/s-1.json").read_text())
    assert (stored["trainable"], stored["reward"], stored["status"]) == (True, 0.0, "interrupted")
    assert "ephemeral" in stored["evaluation"]["detail"]["agent_fault"]
    assert not (tmp_path / "state/ingest/partial/s-1.json").exists()
    assert trainer.ingest.counts["agentFault"] == 1

    stats = trainer.run_once()
    assert stats is not None, "the group trained, the agent's loss in it"
    assert stats.sessions == 3 and stats.sequences == 3
    assert stats.reward_mean == 2 / 3
    assert [(r["sessions"], r["rewardMean"]) for r in trainer.sampled_by_version()] == [(3, 2 / 3)]
    assert b"floe_trainer_agent_fault_sessions_total 1.0" in trainer.metrics.render()
    # A restart replays it as the trajectory it became.
    assert [t.session for t in trainer.ingest.store.load()] == ["s-0", "s-1", "s-2"]


def test_an_evicted_agent_scores_the_jobs_failure_reward_never_above_a_wrong_answer(tmp_path):
    # An evaluator whose wrong answers score -1: a loss scored 0 would pay better than one.
    trainer = tiny_trainer(tmp_path, 3, {"failureReward": -1.0}, learningRate=1e-3)
    assert trainer.ingest.handle(sample("s-0", 0, 1.0))[0] == 200
    assert trainer.ingest.handle(sample("s-2", 2, -1.0))[0] == 200
    assert partial(trainer, "s-1", 1, 1)[0] == 200
    got = trainer.sample_failed("j/t", 1, "s-1", "evicted for its disk")
    assert got == {"scored": -1.0, "session": "s-1"}
    stored = json.loads((tmp_path / "state/ingest/s-1.json").read_text())
    assert (stored["reward"], stored["evaluation"]["reward"]) == (-1.0, -1.0)
    stats = trainer.run_once()
    assert stats is not None and stats.sessions == 3
    assert stats.reward_mean == -1 / 3


def test_a_session_with_its_own_trajectory_is_never_scored_from_a_snapshot(tmp_path):
    trainer = trainer_of(tmp_path)
    partial(trainer, "s-0", 0, 1)
    # Its trajectory came (its verdict its own): the snapshot is gone, later ones not kept.
    assert trainer.ingest.handle(sample("s-0", 0, 1.0))[0] == 200
    assert not (tmp_path / "state/ingest/partial/s-0.json").exists()
    assert partial(trainer, "s-0", 0, 2) == (
        200,
        {"session": "s-0", "kept": False, "deltas": True},
    )
    assert trainer.ingest.score_partial("s-0", "j/t", 0, "evicted") is None
    # No snapshot at all (the agent never called the model): the sample fails, its group goes on.
    trainer.ingest.handle(sample("s-2", 2, 0.0))
    assert trainer.sample_failed("j/t", 1, "s-1", "evicted") == {"failed": True}
    assert trainer.ingest.counts["agentFaultUnscored"] == 2, "s-0's ruling and s-1's"
    stats = trainer.run_once()
    assert stats is not None and stats.sessions == 2


def test_snapshots_need_the_ingest_token_and_must_be_untrainable(tmp_path):
    trainer = trainer_of(tmp_path)
    srv = make_server(trainer.ingest, ("127.0.0.1", 0), lambda: {}, ingest_token="1ngest")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1/partial"

    def post(body: bytes, token: str | None, session="s-1", calls="1") -> int:
        req = urllib.request.Request(url, data=body, method="POST")
        req.add_header("floe-session", session)
        req.add_header("floe-calls", calls)
        if token:
            req.add_header("authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        # An agent shares its pod's network: a snapshot of its own making is refused.
        assert post(sample("s-1", 1, None, 1), None) == 401
        assert post(sample("s-1", 1, None, 1), "1ngest", session="../x") == 400
        assert post(sample("s-1", 1, None, 1), "1ngest", calls="one") == 400
        assert not (tmp_path / "state/ingest/partial/s-1.json").exists()
        assert post(sample("s-1", 1, None, 1), "1ngest") == 200
        assert (tmp_path / "state/ingest/partial/s-1.json").exists()
    finally:
        srv.shutdown()
    # Kept as it came; checked only when a ruling would score it. A body that is not a
    # snapshot of that session and sample, untrainable, scores nothing.
    for session, body in [
        ("s-2", sample("s-2", 2, 1.0)),  # scored already: a reward chosen by its poster
        ("s-3", b"{"),
        ("s-4", sample("s-1", 1, None, 1)),  # another session's
    ]:
        assert trainer.ingest.handle_partial(session, "1", body)[0] == 200
        assert trainer.ingest.score_partial(session, "j/t", int(session[-1]), "evicted") is None
    assert trainer.ingest.counts["agentFaultUnscored"] == 3
    # The session failed, not by its agent: its snapshot is dropped; at the end, all of them.
    assert trainer.sample_failed("j/t", 1, "s-1") == {"failed": True}
    assert not (tmp_path / "state/ingest/partial/s-1.json").exists()
    trainer.finish()
    assert not (tmp_path / "state/ingest/partial").exists()


def test_a_ruling_the_trainer_fails_to_take_gets_a_500_that_says_why(tmp_path):
    def failed(*_):
        raise OSError(28, "No space left on device")

    srv = make_server(None, ("127.0.0.1", 0), dict, control_token="c0ntrol", failed=failed)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    body = json.dumps({"group": "j/t", "sample": 1, "session": "s-1", "agentFault": "evicted"})
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.server_address[1]}/v1/failed",
        data=body.encode(),
        method="POST",
        headers={"authorization": "Bearer c0ntrol"},
    )
    try:
        urllib.request.urlopen(req)
        raise AssertionError("taken")
    except urllib.error.HTTPError as e:
        # The operator tells it again on its next round (a 5xx is worth another try).
        assert e.code == 500
        assert "No space left" in json.loads(e.read())["error"]
    finally:
        srv.shutdown()


def test_the_ruling_a_trainer_could_not_take_is_told_again(tmp_path):
    trainer = trainer_of(tmp_path)
    trainer.ingest.handle(sample("s-0", 0, 1.0))
    trainer.ingest.handle(sample("s-2", 2, 0.0))
    # Its own trajectory came first, untrainable (dropped): the ruling completes its group.
    body = json.loads(sample("s-1", 1, None, 1))
    body["evaluation"] = {"reward": None, "passed": None, "detail": {"error": "pod lost"}}
    trainer.ingest.handle(json.dumps(body).encode())
    assert trainer.sample_failed("j/t", 1, "s-1", "evicted") == {"known": True, "session": "s-1"}
    # The agent's loss, with no snapshot to score: lost, and counted so (as a ruling heard
    # before the drain is), once however often it is told.
    assert trainer.sample_failed("j/t", 1, "s-1", "evicted") == {"known": True, "session": "s-1"}
    assert trainer.ingest.counts["agentFaultUnscored"] == 1
    stats = trainer.run_once()
    assert stats is not None and stats.sessions == 2, "the group did not wait for sample 1"


def test_a_ruling_heard_after_the_gateway_drained_still_scores_the_agents_loss(tmp_path):
    # The operator lets the pod go whatever the trainer answered; its gateway, stopping, ships
    # the session as an untrainable infrastructure failure. That deleted the snapshot and the
    # ruling, told again, found the session "known": the loss vanished from its group.
    trainer = trainer_of(tmp_path)
    assert trainer.ingest.handle(sample("s-0", 0, 1.0))[0] == 200
    assert trainer.ingest.handle(sample("s-2", 2, 1.0))[0] == 200
    assert partial(trainer, "s-1", 1, 2)[0] == 200
    drained = json.loads(sample("s-1", 1, None, 2))
    drained["status"] = "error"
    assert trainer.ingest.handle(json.dumps(drained).encode())[0] == 200
    assert trainer.run_once() is None, "no sample yet"
    got = trainer.sample_failed("j/t", 1, "s-1", "the grader ran out of memory")
    assert got == {"scored": 0.0, "session": "s-1"}
    stats = trainer.run_once()
    assert stats is not None and stats.sequences == 3, "the loss trains with its group"
    assert [(r["sessions"], r["rewardMean"]) for r in trainer.sampled_by_version()] == [(3, 2 / 3)]
    again = trainer.sample_failed("j/t", 1, "s-1", "the grader ran out of memory")
    assert again == {"known": True, "session": "s-1"}, "told again, it changes nothing"


def test_an_infrastructure_failure_ruled_so_keeps_its_untrainable_trajectory(tmp_path):
    trainer = trainer_of(tmp_path)
    assert partial(trainer, "s-1", 1, 2)[0] == 200
    drained = json.loads(sample("s-1", 1, None, 2))
    assert trainer.ingest.handle(json.dumps(drained).encode())[0] == 200
    assert trainer.sample_failed("j/t", 1, "s-1") == {"known": True, "session": "s-1"}
    assert trainer.buffer.dropped["failed"] == 1, "its group goes on without it"
    assert not (tmp_path / "state/ingest/partial/s-1.json").exists(), "nothing to score it"


def test_a_session_run_again_after_an_untrainable_record_is_scored_from_its_own_snapshots(
    tmp_path,
):
    """A session whose gateway was drained (an untrainable record stored, its snapshot kept)
    and that runs again under its id (its pod went before its assigned mark): the new run's
    snapshots were answered "not kept", so a ruling on the new run scored the old run's."""
    trainer = trainer_of(tmp_path)
    assert partial(trainer, "s-1", 1, 5)[0] == 200
    assert trainer.ingest.handle(sample("s-1", 1, None, calls=5))[0] == 200
    assert trainer.ingest.store.untrainable("s-1")
    # The run again: fewer calls than the old run's snapshot, kept all the same, then in order.
    for calls, kept in ((2, True), (3, True), (1, False)):
        assert partial(trainer, "s-1", 1, calls)[1]["kept"] is kept, calls
    held = json.loads((tmp_path / "state/ingest/partial/s-1.json").read_text())
    assert held["stats"]["completions"] == 3, "the new run's last snapshot"
    # A delta goes on that snapshot only: before the new run's first whole one, a conflict.
    store = trainer.ingest.store
    assert store.put_partial_delta("s-1", "none", 4, b"{}", "x") == "conflict"


def test_a_snapshot_posted_while_the_trainer_stops_is_kept_for_the_ruling_its_successor_hears(
    tmp_path,
):
    # A pod deleted: SIGTERM reaches the trainer and the pod's vLLM at once, and vLLM may still
    # answer a call whose snapshot comes after it. The ingest serves through the stop
    # checkpoint, so that snapshot is kept, and the restarted trainer scores the agent's loss.
    from floe_trainer import cli

    trainer = trainer_of(tmp_path)
    server = cli.start_server(trainer, {"ingestListen": "127.0.0.1:0"})
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/partial"

    def post() -> int:
        req = urllib.request.Request(url, data=sample("s-1", 1, None, 1), method="POST")
        req.add_header("floe-session", "s-1")
        req.add_header("floe-calls", "1")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status

    posted = []
    save = trainer.save_checkpoint

    def save_checkpoint():
        posted.append(post())
        save()

    trainer.save_checkpoint = save_checkpoint
    stop = threading.Event()
    stop.set()
    assert cli.train_until_stopped(trainer, server, stop, 0.01) == 0
    assert posted == [200]
    try:
        post()
        raise AssertionError("the stopped trainer still serves")
    except urllib.error.URLError:
        pass
    successor = trainer_of(tmp_path)
    got = successor.sample_failed("j/t", 1, "s-1", "Pod ephemeral local storage usage exceeds")
    assert got == {"scored": 0.0, "session": "s-1"}
