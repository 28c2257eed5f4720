"""A gateway sends a running session's snapshots after the first as deltas on the last one the
trainer kept (``snapshot_delta``): the ingest keeps them as they come, refuses one whose base it
does not hold (409: the gateway sends the whole one), and a ruling scores the snapshot they
add up to, the same as the whole one would have been."""

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

from floe_trainer.ingest import Ingest, Store, make_server
from floe_trainer.snapshot_delta import DELTA_FORMAT, InvalidDelta, apply_delta


def trace(prompt, response, seqs, finish="tool_calls", start="first"):
    return {
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "loss_mask": [1] * len(response),
        "logprobs": [-0.5] * len(response),
        "finish_reason": finish,
        "completions": seqs,
        "start": start,
    }


def snapshot(session, traces, calls, sample=1):
    return {
        "format": "floe.trajectory/v1",
        "session": session,
        "task": "t",
        "group": "j/t",
        "sample": sample,
        "status": "interrupted",
        "trainable": False,
        "reward": None,
        "builder": "prefix_merging",
        "policy_versions": [0],
        "traces": traces,
        "stats": {"completions": calls},
    }


def delta(after, base_calls, entries):
    return {
        "format": DELTA_FORMAT,
        "base_calls": base_calls,
        "trajectory": {**after, "traces": []},
        "traces": entries,
    }


# Three snapshots of one session: a chain that grows, and a background call beside it.
ONE = snapshot("s-1", [trace([1, 2], [3, 4], [0])], 1)
TWO = snapshot(
    "s-1",
    [trace([1, 2], [3, 4, 9, 5, 6], [0, 1]), trace([7, 7], [8], [2], "stop", "new_context")],
    3,
)
THREE = snapshot(
    "s-1",
    [
        trace([1, 2], [3, 4, 9, 5, 6, 9, 10], [0, 1, 3], "stop"),
        trace([7, 7], [8], [2], "stop", "new_context"),
    ],
    4,
)
TWO_ON_ONE = delta(
    TWO,
    1,
    [
        {
            "extends": 0,
            "response_token_ids": [9, 5, 6],
            "loss_mask": [1, 1, 1],
            "logprobs": [-0.5, -0.5, -0.5],
            "finish_reason": "tool_calls",
            "completions": [0, 1],
            "start": "first",
        },
        {"trace": TWO["traces"][1]},
    ],
)
THREE_ON_TWO = delta(
    THREE,
    3,
    [
        {
            "extends": 0,
            "response_token_ids": [9, 10],
            "loss_mask": [1, 1],
            "logprobs": [-0.5, -0.5],
            "finish_reason": "stop",
            "completions": [0, 1, 3],
            "start": "first",
        },
        {"same": 1},
    ],
)


def test_deltas_rebuild_each_snapshot():
    assert apply_delta(ONE, TWO_ON_ONE) == TWO
    assert apply_delta(TWO, THREE_ON_TWO) == THREE
    # A trace whose last call has no finish reason (cut off) loses the one it had.
    cut = json.loads(json.dumps(THREE_ON_TWO))
    del cut["traces"][0]["finish_reason"]
    assert "finish_reason" not in apply_delta(TWO, cut)["traces"][0]


@pytest.mark.parametrize(
    "held, body, why",
    [
        (ONE, THREE_ON_TWO, "against 3 calls"),
        (TWO, {**THREE_ON_TWO, "format": "floe.trajectory/v1"}, "not a"),
        (TWO, {**THREE_ON_TWO, "traces": [{"same": 2}]}, "no held trace 2"),
        (TWO, {**THREE_ON_TWO, "traces": [{"same": True}]}, "no held trace True"),
        (TWO, {**THREE_ON_TWO, "traces": [{"extends": 0}]}, "without response_token_ids"),
        (TWO, {**THREE_ON_TWO, "traces": [{"keep": 0}]}, "none of same"),
        (TWO, {**THREE_ON_TWO, "trajectory": None}, "needs its trajectory"),
    ],
)
def test_a_delta_that_does_not_fit_its_snapshot_is_refused(held, body, why):
    with pytest.raises(InvalidDelta, match=why):
        apply_delta(held, body)


def sid(calls):
    """The snapshot id a gateway gives the snapshot of ``calls`` calls here."""
    return f"{calls:04x}"


def post(ingest, body, calls, base=None):
    """A whole snapshot of ``calls`` calls, or with ``base`` (calls) a delta on that one."""
    raw = json.dumps(body).encode()
    return ingest.handle_partial(
        "s-1", str(calls), raw, sid(calls), None if base is None else sid(base)
    )


def test_the_ingest_keeps_deltas_on_the_snapshot_they_build_on_and_scores_their_sum(tmp_path):
    ingest = Ingest(Store(tmp_path), lambda t: None)
    # Without a whole snapshot there is nothing to build on: the gateway sends the whole one.
    assert post(ingest, TWO_ON_ONE, 3, 1)[0] == 409
    assert post(ingest, ONE, 1) == (200, {"session": "s-1", "kept": True, "deltas": True})
    assert post(ingest, TWO_ON_ONE, 3, 1) == (200, {"session": "s-1", "kept": True, "deltas": True})
    # A delta on a snapshot this trainer no longer holds as its latest.
    code, said = post(ingest, TWO_ON_ONE, 3, 1)
    assert (code, said["deltas"]) == (409, True)
    assert post(ingest, THREE_ON_TWO, 4, 3)[0] == 200
    assert ingest.store.load_partial("s-1") == THREE
    assert ingest.counts["partial"] == 3 and ingest.counts["partialDeltas"] == 2
    # Ids that are not ids, a delta without its own.
    raw = json.dumps(THREE_ON_TWO).encode()
    assert ingest.handle_partial("s-1", "5", raw, "x!", sid(4))[0] == 400
    assert ingest.handle_partial("s-1", "5", raw, sid(5), "")[0] == 400
    assert ingest.handle_partial("s-1", "5", raw, None, sid(4))[0] == 400
    # A whole snapshot of as many calls posted late (its answer never reached the gateway,
    # which went on with a delta) replaces the base: the next delta names another, refused.
    assert ingest.handle_partial("s-1", "4", json.dumps(THREE).encode(), "ffff")[0] == 200
    assert post(ingest, THREE_ON_TWO, 5, 4)[0] == 409

    # A restarted trainer holds the files, not which one is last: deltas are refused until a
    # whole one comes, and a ruling scores what the files add up to.
    again = Ingest(Store(tmp_path), lambda t: None)
    assert post(again, THREE_ON_TWO, 5, 4)[0] == 409
    scored = again.score_partial("s-1", "j/t", 1, "evicted")
    assert scored is not None and scored.session == "s-1"
    stored = json.loads((tmp_path / "s-1.json").read_text())
    assert stored["traces"] == THREE["traces"]
    assert (stored["trainable"], stored["reward"]) == (True, 0.0)
    assert not (tmp_path / "partial/s-1.d").exists(), "the trajectory replaced its snapshot"


def test_a_whole_snapshot_replaces_the_deltas_and_a_torn_one_leaves_the_one_before(tmp_path):
    ingest = Ingest(Store(tmp_path), lambda t: None)
    post(ingest, ONE, 1)
    post(ingest, TWO_ON_ONE, 3, 1)
    post(ingest, THREE_ON_TWO, 4, 3)
    # A trainer that crashed lost the end of the last delta (they are not fsynced).
    last = tmp_path / "partial/s-1.d/4.json"
    last.write_bytes(last.read_bytes()[:20])
    assert ingest.store.load_partial("s-1") == TWO
    post(ingest, THREE, 4)
    assert not (tmp_path / "partial/s-1.d").exists()
    assert ingest.store.load_partial("s-1") == THREE
    # A failure not the agent's forgets the snapshot and its deltas.
    post(ingest, THREE_ON_TWO, 5, 4)
    ingest.store.drop_partial("s-1")
    assert not (tmp_path / "partial/s-1.d").exists()
    assert ingest.store.load_partial("s-1") is None


def test_a_delta_over_http_names_its_base_in_a_header(tmp_path):
    ingest = Ingest(Store(tmp_path), lambda t: None)
    srv = make_server(ingest, ("127.0.0.1", 0), lambda: {}, ingest_token="1ngest")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1/partial"

    def send(body, calls, base=None, path=""):
        to = url + ("/delta" if base is not None else "") + path
        req = urllib.request.Request(to, data=json.dumps(body).encode(), method="POST")
        req.add_header("floe-session", "s-1")
        req.add_header("floe-calls", str(calls))
        req.add_header("floe-snapshot", sid(calls))
        req.add_header("authorization", "Bearer 1ngest")
        if base is not None:
            req.add_header("floe-base-snapshot", base)
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        assert send(TWO_ON_ONE, 3, sid(1))[0] == 409
        assert send(ONE, 1) == (200, {"session": "s-1", "kept": True, "deltas": True})
        assert send(TWO_ON_ONE, 3, "one")[0] == 400
        assert send(TWO_ON_ONE, 3, "")[0] == 400, "the delta route needs a base"
        assert send(TWO_ON_ONE, 3, sid(1))[0] == 200
        assert ingest.store.load_partial("s-1") == TWO
        assert send(ONE, 1, path="/more")[0] == 404

        # A poster that gave up mid-body: nothing of it is kept.
        host, port = srv.server_address
        with socket.create_connection((host, port)) as conn:
            body = json.dumps(THREE).encode()
            conn.sendall(
                b"POST /v1/partial HTTP/1.1\r\nHost: x\r\nfloe-session: s-1\r\n"
                b"floe-calls: 4\r\nauthorization: Bearer 1ngest\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body[:50]
            )
            conn.shutdown(socket.SHUT_WR)
            assert b" 400 " in conn.recv(4096).split(b"\r\n")[0] + b" "
        assert ingest.store.load_partial("s-1") == TWO
    finally:
        srv.shutdown()


def test_the_deltas_kept_on_a_snapshot_never_outgrow_it(tmp_path, monkeypatch):
    # A delta names every trace held, so a session of many short calls of its own (each a new
    # trace) sends deltas that grow with it: kept all, the square of its calls on disk. Past
    # the whole snapshot's size the trainer asks for the whole one again (409).
    from floe_trainer import ingest as ingest_module

    monkeypatch.setattr(ingest_module, "DELTAS_AT_LEAST", 0)
    ingest = Ingest(Store(tmp_path), lambda t: None)
    whole = json.dumps(ONE).encode()
    assert ingest.handle_partial("s-1", "1", whole, sid(1))[0] == 200
    delta = b"d" * (len(whole) // 3 + 1)
    answers = [
        ingest.handle_partial("s-1", str(calls), delta, sid(calls), sid(calls - 1))[0]
        for calls in range(2, 6)
    ]
    assert answers == [200, 200, 409, 409], answers
    kept = sum(p.stat().st_size for p in (tmp_path / "partial/s-1.d").iterdir())
    assert kept <= len(whole)
    # The whole one sent then starts afresh.
    assert ingest.handle_partial("s-1", "4", whole, sid(4))[0] == 200
    assert not (tmp_path / "partial/s-1.d").exists()
    assert ingest.handle_partial("s-1", "5", delta, sid(5), sid(4))[0] == 200
