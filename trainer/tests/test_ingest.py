import contextlib
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from floe_trainer.ingest import Ingest, Store, make_server


def trajectory(session="job-t-0", reward=1.0, **over):
    t = {
        "format": "floe.trajectory/v1",
        "session": session,
        "task": "t",
        "group": "job/t",
        "sample": 0,
        "status": "completed",
        "trainable": True,
        "reward": reward,
        "builder": "prefix_merging",
        "policy_versions": [0],
        "traces": [
            {
                "prompt_token_ids": [1, 2],
                "response_token_ids": [3, 4, 5],
                "loss_mask": [1, 0, 1],
                "logprobs": [-0.5, None, -0.1],
                "finish_reason": "stop",
                "completions": [0],
                "start": "first",
            }
        ],
        "stats": {},
    }
    t.update(over)
    return t


@pytest.fixture
def server(tmp_path):
    got = []
    ingest = Ingest(Store(tmp_path / "ingest"), got.append, max_body_bytes=100_000)
    srv = make_server(ingest, ("127.0.0.1", 0), lambda: {"accepted": ingest.counts["accepted"]})
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", got, tmp_path / "ingest"
    srv.shutdown()


def post(url, body: bytes, token=None, path="/v1/trajectories"):
    """POST ``body`` to ``url + path``, with ``token`` as a bearer token: status and answer."""
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@contextlib.contextmanager
def served(tmp_path, **kwargs):
    """A real ingest server on a free loopback port, for as long as the block runs."""
    ingest = Ingest(Store(tmp_path / "ingest"), lambda t: None)
    srv = make_server(ingest, ("127.0.0.1", 0), lambda: {}, **kwargs)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_silent_connection_is_closed_and_others_are_served(tmp_path, monkeypatch):
    # An agent's idle connections hold a thread each: they are let go of after IDLE_SECONDS.
    import socket

    from floe_trainer import ingest as ingest_module

    monkeypatch.setattr(ingest_module, "IDLE_SECONDS", 0.5)
    with served(tmp_path) as srv:
        idle = socket.create_connection(srv.server_address, timeout=10)
        idle.settimeout(10)
        assert idle.recv(1) == b"", "closed by the server, not left open"
        code, _ = post(
            f"http://127.0.0.1:{srv.server_address[1]}", json.dumps(trajectory()).encode()
        )
        assert code == 200


def test_a_head_sent_a_byte_at_a_time_is_cut_off_and_others_are_served(tmp_path, monkeypatch):
    # Never silent for IDLE_SECONDS, the head never whole: it is cut at HEAD_SECONDS, and a
    # head past HEAD_BYTES gets a 431, not a thread and megabytes held as long as the agent
    # likes.
    import socket
    import time

    from floe_trainer import http_limits

    monkeypatch.setattr(http_limits, "HEAD_SECONDS", 1.0)
    with served(tmp_path) as srv:
        trickle = socket.create_connection(srv.server_address, timeout=10)
        trickle.sendall(b"POST /v1/trajectories HTTP/1.1\r\n")
        started = time.monotonic()
        with pytest.raises(OSError):
            while time.monotonic() - started < 8:
                trickle.sendall(b"x")
                time.sleep(0.2)
                if trickle.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                    raise ConnectionResetError("closed by the server")
        assert time.monotonic() - started < 4, "cut at the head's deadline"
        big = socket.create_connection(srv.server_address, timeout=10)
        big.sendall(b"GET /healthz HTTP/1.1\r\n" + b"x-pad: " + b"a" * 60000 + b"\r\n")
        big.sendall(b"x-more: " + b"b" * 60000 + b"\r\n\r\n")
        assert big.recv(64).startswith(b"HTTP/1.0 431"), "refused past HEAD_BYTES"
        code, _ = post(
            f"http://127.0.0.1:{srv.server_address[1]}", json.dumps(trajectory()).encode()
        )
        assert code == 200


def test_a_peer_past_its_share_loses_its_oldest_connection_not_the_gateways(tmp_path, monkeypatch):
    # The agent shares its pod's address with its gateway: connections it holds half-sent
    # cannot keep out the gateway's post, and one that carried the token is never closed to
    # make room.
    import socket

    from floe_trainer import http_limits

    monkeypatch.setattr(http_limits, "PER_PEER", 2)
    with served(tmp_path, ingest_token="tok") as srv:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        held = []
        for _ in range(2):
            c = socket.create_connection(srv.server_address, timeout=10)
            c.sendall(b"POST /v1/trajectories HTTP/1.1\r\n")
            held.append(c)
        code, _ = post(url, json.dumps(trajectory()).encode(), token="tok")
        assert code == 200, "the gateway's post got in"
        # Past the share, the oldest half-sent connection goes (after the grace), not the
        # newest: the gateway's, accepted in a burst behind the agent's, has its time to vouch.
        c = socket.create_connection(srv.server_address, timeout=10)
        c.sendall(b"POST /v1/trajectories HTTP/1.1\r\n")
        held.append(c)
        assert held[0].recv(1) == b"", "the oldest half-sent connection was closed"
        code, _ = post(url, json.dumps(trajectory(session="job-t-1")).encode(), token="tok")
        assert code == 200
        held[2].settimeout(1)
        with pytest.raises(TimeoutError):
            held[2].recv(1)


def test_past_the_total_a_connection_waits_in_the_backlog_not_refused(tmp_path, monkeypatch):
    import socket
    import time

    from floe_trainer import http_limits

    monkeypatch.setattr(http_limits, "TOTAL", 1)
    monkeypatch.setattr(http_limits, "HEAD_SECONDS", 1.0)
    with served(tmp_path) as srv:
        hold = socket.create_connection(srv.server_address, timeout=10)
        hold.sendall(b"POST /v1/trajectories HTTP/1.1\r\n")
        started = time.monotonic()
        # Served once the held one is cut at its head's deadline, not reset at once.
        code, _ = post(
            f"http://127.0.0.1:{srv.server_address[1]}", json.dumps(trajectory()).encode()
        )
        assert code == 200
        assert time.monotonic() - started >= 0.5, "it waited for the slot"


def test_accepted_persisted_then_idempotent(server):
    url, got, directory = server
    code, body = post(url, json.dumps(trajectory()).encode())
    assert code == 200 and body["accepted"]
    assert (directory / "job-t-0.json").exists()
    assert [t.session for t in got] == ["job-t-0"]
    code, body = post(url, json.dumps(trajectory()).encode())
    assert code == 409
    assert len(got) == 1
    # A restart replays what was acknowledged.
    assert [t.session for t in Store(directory).load()] == ["job-t-0"]
    # The longest session id the gateway makes is stored.
    code, body = post(url, json.dumps(trajectory(session="s" * 240)).encode())
    assert code == 200 and body["accepted"], body


def test_a_sessions_trajectory_replaces_its_untrainable_one_never_the_reverse(server):
    # The operator runs a session again under the same id when its pod went before it was
    # marked started; the drained gateway's untrainable record of it can come first.
    url, got, directory = server
    drained = trajectory(session="job-t-s", trainable=False, reward=None, status="error")
    assert post(url, json.dumps(drained).encode())[0] == 200
    code, body = post(url, json.dumps(trajectory(session="job-t-s", reward=0.0)).encode())
    assert code == 200 and body["accepted"], body
    assert [(t.session, t.trainable) for t in got] == [("job-t-s", False), ("job-t-s", True)]
    # Once it trains, anything more of the session is a repeat, and what is kept trains.
    for again in (drained, trajectory(session="job-t-s", reward=1.0)):
        assert post(url, json.dumps(again).encode())[0] == 409
    [kept] = Store(directory).load()
    assert (kept.trainable, kept.reward) == (True, 0.0)


@pytest.mark.parametrize(
    "body, why",
    [
        (b"{not json", "not JSON"),
        (json.dumps(trajectory(format="floe.trajectory/v2")).encode(), "format must be"),
        (json.dumps(trajectory(reward=None)).encode(), "needs a reward"),
        # Past ±1e9: a group's squared differences would overflow, and the trainer, replaying
        # the file after each restart, crash for good.
        (json.dumps(trajectory(reward=1e300)).encode(), "reward must be"),
        (json.dumps(trajectory(reward=10**400)).encode(), "reward must be"),
        (json.dumps(trajectory(session="abc\n")).encode(), "not a safe file name"),
        (json.dumps(trajectory(session="../x")).encode(), "not a safe file name"),
        # Past the gateway's 240: its temporary file's name would pass 255 bytes.
        (json.dumps(trajectory(session="s" * 241)).encode(), "not a safe file name"),
        (
            json.dumps(
                trajectory(
                    traces=[
                        {
                            "prompt_token_ids": [1],
                            "response_token_ids": [2, 3],
                            "loss_mask": [1],
                            "logprobs": [-1.0, -1.0],
                        }
                    ]
                )
            ).encode(),
            "traces[0].loss_mask must match",
        ),
        (
            json.dumps(
                trajectory(
                    traces=[
                        {
                            "prompt_token_ids": [1],
                            "response_token_ids": [2],
                            "loss_mask": [1],
                            "logprobs": [0.5],
                        }
                    ]
                )
            ).encode(),
            "log-probability",
        ),
        (
            json.dumps(
                trajectory(
                    traces=[
                        {
                            "prompt_token_ids": [],
                            "response_token_ids": [2],
                            "loss_mask": [1],
                            "logprobs": [-1.0],
                        }
                    ]
                )
            ).encode(),
            "prompt_token_ids must not be empty",
        ),
    ],
)
def test_bad_bodies_get_a_400_that_says_why_and_leave_nothing(server, body, why):
    url, got, directory = server
    code, reply = post(url, body)
    assert code == 400
    assert why in reply["error"]
    assert got == [] and list(directory.glob("*.json")) == []


def test_a_sessions_overlong_calls_are_read_from_its_stats():
    from floe_trainer import wire

    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "docs/trajectory.schema.json").read_text()
    )
    assert "overlong_turns" in schema["$defs"]["ReconstructionStats"]["properties"], (
        "the gateway's name"
    )
    assert wire.parse(trajectory()).overlong_turns == 0, "absent: none"
    got = wire.parse(trajectory(stats={"truncated_turns": 3, "overlong_turns": 2}))
    assert got.overlong_turns == 2
    for bad in ({"overlong_turns": -1}, {"overlong_turns": True}, []):
        with pytest.raises(wire.InvalidTrajectory, match="stats"):
            wire.parse(trajectory(stats=bad))


def test_too_large_is_413(server):
    url, got, _ = server
    code, reply = post(url, b" " * 100_001)
    assert code == 413 and "bytes" in reply["error"]


def test_with_an_ingest_token_only_its_bearer_may_post(tmp_path):
    got = []
    ingest = Ingest(Store(tmp_path / "ingest"), got.append, max_body_bytes=100_000)
    srv = make_server(ingest, ("127.0.0.1", 0), lambda: {}, ingest_token="s3cret")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        body = json.dumps(trajectory(reward=1.0)).encode()
        # What an agent sharing its pod's network could try: no token, or its own session's.
        for headers in ({}, {"authorization": "Bearer session-token"}):
            req = urllib.request.Request(
                url + "/v1/trajectories",
                data=body,
                method="POST",
                headers={"content-type": "application/json", **headers},
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req)
            assert refused.value.code == 401
        assert got == [] and not (tmp_path / "ingest" / "job-t-0.json").exists()
        req = urllib.request.Request(
            url + "/v1/trajectories",
            data=body,
            method="POST",
            headers={"content-type": "application/json", "authorization": "Bearer s3cret"},
        )
        with urllib.request.urlopen(req) as r:
            assert r.status == 200
        assert [t.session for t in got] == ["job-t-0"]
    finally:
        srv.shutdown()


def test_the_status_gives_its_growing_lists_whole_to_the_control_token_only(tmp_path):
    # The trainer's port is open to every sandbox pod of the job; the per-step rows grow with
    # the run, and serialising them for an agent asking in a loop would cost the trainer.
    rows = [{"step": i} for i in range(1, 31)]
    status = {"step": 30, "steps": rows, "sampled": rows[:5]}
    srv = make_server(
        Ingest(Store(tmp_path / "ingest"), lambda t: None),
        ("127.0.0.1", 0),
        lambda: {k: list(v) if isinstance(v, list) else v for k, v in status.items()},
        control_token="c0ntrol",
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1/status"

    def get(token=None):
        req = urllib.request.Request(url)
        if token:
            req.add_header("authorization", f"Bearer {token}")
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    try:
        for token in (None, "session-token"):
            part = get(token)
            assert part["step"] == 30
            assert [r["step"] for r in part["steps"]] == list(range(11, 31)), "the last 20"
            assert part["stepsOmitted"] == 10
            assert len(part["sampled"]) == 5 and "sampledOmitted" not in part
        whole = get("c0ntrol")
        assert len(whole["steps"]) == 30 and "stepsOmitted" not in whole
    finally:
        srv.shutdown()


def test_a_failed_sample_is_reported_with_the_control_token_only(tmp_path):
    failed = []
    ingest = Ingest(Store(tmp_path / "ingest"), lambda t: None)
    srv = make_server(
        ingest,
        ("127.0.0.1", 0),
        lambda: {},
        control_token="c0ntrol",
        failed=lambda g, s, session, why: failed.append((g, s, session, why)) or {},
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"

    def send(body, token=None):
        return post(url, body, token, "/v1/failed")[0]

    try:
        good = json.dumps({"group": "job/t", "sample": 2}).encode()
        # An agent on the pod's network must not make its group's other samples train alone.
        assert send(good) == 401 and send(good, "session-token") == 401
        assert send(b'{"group": "job/t"}', "c0ntrol") == 400
        assert send(b'{"group": "job/t", "sample": -1}', "c0ntrol") == 400
        assert failed == []
        assert send(good, "c0ntrol") == 202
        assert failed == [("job/t", 2, None, None)]
        # The agent's own failure names its session; a fault without one is refused.
        fault = {"group": "job/t", "sample": 3, "session": "job-t-3", "agentFault": "evicted"}
        assert send(json.dumps(fault).encode(), "c0ntrol") == 202
        assert failed[-1] == ("job/t", 3, "job-t-3", "evicted")
        del fault["session"]
        assert send(json.dumps(fault).encode(), "c0ntrol") == 400
    finally:
        srv.shutdown()


def test_the_fidelity_check_takes_the_control_token_and_sampled_traces_only(tmp_path):
    seen = []

    def fidelity(traces):
        seen.append(traces)
        return {"tokens": 2, "mismatch": 0.01, "max": 0.02}

    ingest = Ingest(Store(tmp_path / "ingest"), lambda t: None)
    srv = make_server(
        ingest, ("127.0.0.1", 0), lambda: {}, control_token="c0ntrol", fidelity=fidelity
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"

    def send(body, token=None):
        return post(url, body, token, "/v1/fidelity")

    trace = {"prompt_token_ids": [1, 2], "response_token_ids": [3, 4], "logprobs": [-0.5, -1.0]}
    good = json.dumps({"traces": [trace]}).encode()
    try:
        assert send(good)[0] == 401
        assert send(b'{"traces": []}', "c0ntrol")[0] == 400
        unknown = {**trace, "logprobs": [-0.5, None]}
        code, body = send(json.dumps({"traces": [unknown]}).encode(), "c0ntrol")
        assert code == 400 and "logprob" in body["error"]
        assert seen == []
        code, body = send(good, "c0ntrol")
        assert (code, body["mismatch"]) == (200, 0.01)
        assert seen[0][0].response_token_ids == [3, 4]
    finally:
        srv.shutdown()
