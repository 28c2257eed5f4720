"""Trajectory ingest: ``POST /v1/trajectories`` (the gateway's trainer sink), idempotent by
session, persisted before it is acknowledged.

Each accepted trajectory is written to ``DIR/<session>.json`` (temporary file, fsync, rename,
fsync of the directory) before the reply, so a trainer restart loses nothing it acknowledged;
``load()`` replays them. A body that is too large, not JSON or not a valid trajectory gets a
4xx with ``{"error": why}`` and nothing of it is kept. Answers: 200 accepted, 409 already
ingested (the gateway's sink counts it as done), 400 invalid, 413 too large.

``POST /v1/finish`` (the job's sessions are all done: train what is left, write the final
checkpoint) needs the control token as a bearer token: the ingest port is reachable from the
sandbox pods, whose agents must not end a training run. Without a token it is refused.
``POST /v1/failed`` ``{"group": G, "sample": S}`` (that sample's session failed for good by
infrastructure: its retries are spent, no trajectory of it will come) takes the same token:
its group then completes without it instead of waiting for the job's end. With
``"session": ID, "agentFault": why`` the failure was the agent's own doing (its pod evicted for
what it wrote, which kills the pod with no grace period): the last snapshot of that session
(below) is scored the job's failure reward (``failureReward``, default 0) and trains as the
loss it is (``Ingest.score_partial``); without one the sample fails as above. Otherwise a
policy that fills its disk when losing would see its losses vanish instead of being pushed
down. ``POST /v1/fidelity`` (the same token) scores sampled
tokens under the trainer's policy against vLLM's log-probs (``fidelity``): the check a train
run makes before its first session.

With an ingest token (``FLOE_TRAINER_INGEST_TOKEN``: the job's, which only floe's gateways
hold), ``POST /v1/trajectories`` needs it as a bearer token too (401 without): an agent shares
its pod's network with the gateway, and a trajectory it posted itself would be a reward it
chose.

``POST /v1/partial`` (the ingest token too) takes a snapshot of a train job's session while it
runs: the trajectory as it stands, ``interrupted`` and untrainable, which each of its gateway's
calls posts before its reply, with ``Floe-Session`` and ``Floe-Calls`` headers. The latest one
(by calls) of each session without a trajectory is kept, unparsed, in ``DIR/partial/``; the
session's trajectory deletes it, as do a failure not the agent's and the trainer's finish.
After the first, a gateway sends each as a delta on the last one kept (``POST
/v1/partial/delta``, naming that one's ``Floe-Snapshot`` id in ``Floe-Base-Snapshot``;
``snapshot_delta``), kept beside it in ``DIR/partial/<session>.d/`` until a whole one comes.
Nothing of it trains unless the operator rules the session's failure the agent's own doing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from . import durable, http_limits, snapshot_delta, wire

log = logging.getLogger("floe_trainer.ingest")

# The gateway's limit (``MAX_SESSION_ID_LEN``, 240): ``.<id>.json.tmp`` stays within 255 bytes.
SAFE_SESSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,239}$")
SNAPSHOT_ID = re.compile(r"^[0-9a-f]{1,32}$")
# The bytes of deltas kept on a session's snapshot before the whole one is asked for again:
# its own size, or this much for a small one.
DELTAS_AT_LEAST = 1 << 20


class Store:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # The calls and id (``Floe-Snapshot``, the base a delta must name) of each session's
        # snapshot kept since this process started (a restarted trainer takes the next whole
        # one whatever it holds: a session's gateway posts them in order), and the bytes of
        # its whole snapshot and of the deltas kept on it.
        self._held: dict[str, tuple[int, str | None, int, int]] = {}
        # Sessions whose stored trajectory is untrainable (a drained run) and whose run again,
        # under the same id, has had a snapshot kept since this process started.
        self._rerun: set[str] = set()

    def path(self, session: str) -> Path:
        return self.dir / f"{session}.json"

    def put(
        self, session: str, raw: bytes, trainable: bool = True, over_untrainable: bool = False
    ) -> bool:
        """Persist durably; False if the session is already stored (``over_untrainable``: unless
        what is stored is an untrainable one, which this replaces). A trainable trajectory
        deletes the session's snapshot; an untrainable one (a gateway drained as its pod went:
        an infrastructure failure, or the agent's, which the operator rules after it) keeps it
        for the ruling."""
        with self._lock:
            target = self.path(session)
            if target.exists() and not (over_untrainable and self.untrainable(session)):
                return False
            durable.write_bytes(target, raw)
            if trainable:
                # The session has its trajectory: its snapshot is of no more use.
                self._forget_partial(session)
            return True

    def untrainable(self, session: str) -> bool:
        """Whether the trajectory stored for ``session`` is one that trains nothing."""
        try:
            return json.loads(self.path(session).read_bytes()).get("trainable") is False
        except (OSError, ValueError, AttributeError):
            return False

    def partial_path(self, session: str) -> Path:
        return self.dir / "partial" / f"{session}.json"

    def deltas_path(self, session: str) -> Path:
        """Where the deltas on the kept snapshot wait, one file per snapshot, by its calls."""
        return self.dir / "partial" / f"{session}.d"

    def _forget_partial(self, session: str) -> None:
        self.partial_path(session).unlink(missing_ok=True)
        shutil.rmtree(self.deltas_path(session), ignore_errors=True)
        self._held.pop(session, None)
        self._rerun.discard(session)

    def _stage(self, session: str, raw: bytes) -> Path:
        """``raw`` written beside the session's snapshot, outside the store's lock, to be
        renamed into place (or unlinked) under it."""
        parent = self.partial_path(session).parent
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".partial-{threading.get_ident()}.tmp"
        tmp.write_bytes(raw)
        return tmp

    def put_partial(
        self, session: str, calls: int, raw: bytes, snapshot: str | None = None
    ) -> bool:
        """Keep a running session's snapshot unless the session has its trajectory or a
        snapshot of more calls is kept (its gateway posts them in order; this is the guard).
        True when kept; ``snapshot``: its id, which a delta on it names. Written outside the
        store's lock, and not fsynced: one per call (a trainer that crashes may keep an older
        one)."""
        tmp = self._stage(session, raw)
        with self._lock:
            held_calls = self._held.get(session, (-1, None, 0, 0))[0]
            if self.path(session).exists():
                # A run stored untrainable (drained as its pod went) then run again under its
                # id: the new run's snapshots are its own, kept over the old run's (whatever
                # its calls), or a ruling on the new run would score the old one's.
                if not self.untrainable(session):
                    tmp.unlink(missing_ok=True)
                    return False
                if session not in self._rerun:
                    self._rerun.add(session)
                    held_calls = -1
            if held_calls > calls:
                tmp.unlink(missing_ok=True)
                return False
            os.replace(tmp, self.partial_path(session))
            shutil.rmtree(self.deltas_path(session), ignore_errors=True)
            self._held[session] = (calls, snapshot, len(raw), 0)
            return True

    def put_partial_delta(
        self, session: str, base: str, calls: int, raw: bytes, snapshot: str
    ) -> str:
        """Keep a delta on the kept snapshot whose id is ``base``, as the snapshot ``snapshot``
        of ``calls`` calls: ``"kept"``; ``"done"`` when the session has its trajectory;
        ``"conflict"`` when the snapshot kept since this process started is another (or none),
        or when the deltas kept on it would outgrow it, so the gateway sends the whole one. (A
        delta names every trace held, so deltas grow with the session: kept all, a session of
        many short calls of its own filled the disk with the square of its calls.)"""
        tmp = self._stage(session, raw)
        with self._lock:
            stored = self.path(session).exists()
            # Read (and parsed) once: the stored trajectory may be large, and the lock is held.
            untrainable = stored and self.untrainable(session)
            if stored and not (session in self._rerun and untrainable):
                tmp.unlink(missing_ok=True)
                # A run again after an untrainable one: its first snapshot comes whole.
                return "conflict" if untrainable else "done"
            held_calls, held_id, whole, deltas = self._held.get(session, (-1, None, 0, 0))
            outgrown = deltas + len(raw) > max(whole, DELTAS_AT_LEAST)
            if (
                held_id != base
                or held_calls >= calls
                or outgrown
                or not self.partial_path(session).exists()
            ):
                tmp.unlink(missing_ok=True)
                return "conflict"
            folder = self.deltas_path(session)
            folder.mkdir(exist_ok=True)
            os.replace(tmp, folder / f"{calls}.json")
            self._held[session] = (calls, snapshot, whole, deltas + len(raw))
            return "kept"

    def load_partial(self, session: str) -> dict | None:
        """The last snapshot kept of ``session``: the whole one with its deltas applied in
        order, up to the first that does not apply (a trainer that crashed may have lost the
        end of one: what is left is still an earlier snapshot of the session)."""
        try:
            body = json.loads(self.partial_path(session).read_bytes())
        except (OSError, ValueError):
            return None
        deltas = []
        for path in self.deltas_path(session).glob("*.json"):
            if path.stem.isdigit():
                deltas.append((int(path.stem), path))
        for _, path in sorted(deltas):
            try:
                body = snapshot_delta.apply_delta(body, json.loads(path.read_bytes()))
            except (OSError, ValueError):
                break
        return body

    def drop_partial(self, session: str) -> None:
        """Forget a session's snapshot (its session failed, not by its agent)."""
        with self._lock:
            self._forget_partial(session)

    def drop_partials(self) -> None:
        """Forget every snapshot left (the job's sessions are all done)."""
        with self._lock:
            shutil.rmtree(self.dir / "partial", ignore_errors=True)
            self._held.clear()

    def failure_path(self, group: str, sample: int) -> Path:
        digest = hashlib.sha256(group.encode()).hexdigest()[:32]
        return self.dir / "failed" / f"{digest}-{sample}.json"

    def put_failure(self, group: str, sample: int) -> None:
        """Keep durably that ``group``'s ``sample`` failed for good, before the ruling is
        answered: the operator tells it once, and a trainer that restarts before its next
        checkpoint would otherwise wait for that sample until the job's end."""
        body = json.dumps({"group": group, "sample": sample}).encode()
        durable.write_bytes(self.failure_path(group, sample), body)

    def failures(self) -> list[tuple[str, int]]:
        """Every failure kept (``put_failure``); an unreadable record is skipped."""
        out = []
        for p in sorted((self.dir / "failed").glob("*.json")):
            try:
                body = json.loads(p.read_bytes())
                out.append((str(body["group"]), int(body["sample"])))
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.error("cannot read the failure record %s (%s): skipped", p, e)
        return out

    def drop_failures(self, groups: set[str]) -> None:
        """Forget the failures of ``groups`` (closed, and saved so by a checkpoint)."""
        for group, sample in self.failures():
            if group in groups:
                self.failure_path(group, sample).unlink(missing_ok=True)

    def load(
        self,
        skip: Callable[[str], bool] = lambda _session: False,
        on_unreadable: Callable[[Path, Exception], None] | None = None,
    ) -> Iterator[wire.Trajectory]:
        """The stored trajectories a restart replays, by file name, one at a time: a long run
        stores every trajectory it was ever sent, so those of sessions ``skip`` names (done
        with at the checkpoint) are never read, and none is held longer than its replay. One
        that cannot be read or is no trajectory (a torn disk, a stricter trainer) is passed to
        ``on_unreadable`` and left out: one bad file must not keep the trainer from starting."""
        for p in sorted(self.dir.glob("*.json")):
            if skip(p.stem):
                continue
            try:
                yield wire.parse(json.loads(p.read_bytes()))
            except (OSError, ValueError, wire.InvalidTrajectory) as e:
                if on_unreadable is None:
                    raise
                on_unreadable(p, e)


class Ingest:
    """Validates, persists and hands each new trajectory to ``on_trajectory``."""

    def __init__(
        self,
        store: Store,
        on_trajectory: Callable[[wire.Trajectory], None],
        max_body_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.store = store
        self.on_trajectory = on_trajectory
        self.max_body_bytes = max_body_bytes
        # ``partial``: snapshots kept; ``agentFault``: sessions scored 0 from their snapshot on
        # a ruling; ``agentFaultUnscored``: ruled so, but no snapshot of it came.
        self.counts = {
            "accepted": 0,
            "duplicate": 0,
            "invalid": 0,
            "partial": 0,
            "partialDeltas": 0,
            "agentFault": 0,
            "agentFaultUnscored": 0,
        }

    def handle(self, raw: bytes) -> tuple[int, dict]:
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self.counts["invalid"] += 1
            return 400, {"error": f"not JSON: {e}"}
        try:
            t = wire.parse(body)
        except wire.InvalidTrajectory as e:
            self.counts["invalid"] += 1
            return 400, {"error": f"not a floe trajectory: {e}"}
        if not SAFE_SESSION.fullmatch(t.session):
            self.counts["invalid"] += 1
            return 400, {"error": f"session id {t.session!r} is not a safe file name"}
        # A trainable trajectory replaces an untrainable one of its session: the operator runs
        # a session again under the same id when its pod went before it was marked started (a
        # mark lost to a crash), so the drained gateway's record of it can come first.
        if not self.store.put(t.session, raw, trainable=t.trainable, over_untrainable=t.trainable):
            self.counts["duplicate"] += 1
            return 409, {"error": "already ingested", "session": t.session}
        self.counts["accepted"] += 1
        self.on_trajectory(t)
        return 200, {"session": t.session, "accepted": True}

    def handle_partial(
        self,
        session: str,
        calls: str,
        raw: bytes,
        snapshot: str | None = None,
        base: str | None = None,
    ) -> tuple[int, dict]:
        """A running session's snapshot (its session, calls and id in the headers
        ``Floe-Session``, ``Floe-Calls`` and ``Floe-Snapshot``): 200 whether kept or not (an
        older one, or a session already in), 400 without them. With ``base``
        (``Floe-Base-Snapshot``, ``POST /v1/partial/delta``) it is a delta on the snapshot of
        that id (``snapshot_delta``): 409 when that is not the one kept, and the gateway sends
        the whole one. The body is kept as it came, never parsed here: one comes with every
        call of every session, and it is read only if a ruling scores it (``score_partial``,
        which checks it then). Every answer says deltas are taken."""
        if not SAFE_SESSION.fullmatch(session):
            return 400, {"error": f"Floe-Session {session!r} is not a safe session id"}
        if not calls.isdigit():
            return 400, {"error": f"Floe-Calls {calls!r} is not a number of calls"}
        for name, value in (("Floe-Snapshot", snapshot), ("Floe-Base-Snapshot", base)):
            if value is not None and not SNAPSHOT_ID.fullmatch(value):
                return 400, {"error": f"{name} {value!r} is not a snapshot id"}
        try:
            if base is None:
                kept = self.store.put_partial(session, int(calls), raw, snapshot)
            elif snapshot is None:
                return 400, {"error": "a delta needs its own Floe-Snapshot"}
            else:
                result = self.store.put_partial_delta(session, base, int(calls), raw, snapshot)
                if result == "conflict":
                    return 409, {"error": f"snapshot {base} is not the one kept", "deltas": True}
                kept = result == "kept"
                if kept:
                    self.counts["partialDeltas"] += 1
        except OSError as e:
            return 500, {"error": f"the snapshot was not kept: {e}"}
        if kept:
            self.counts["partial"] += 1
        return 200, {"session": session, "kept": kept, "deltas": True}

    def has(self, session: str) -> bool:
        """Whether ``session`` has its trajectory stored."""
        return bool(SAFE_SESSION.fullmatch(session)) and self.store.path(session).exists()

    def score_partial(
        self, session: str, group: str, sample: int, why: str, reward: float = 0.0
    ) -> wire.Trajectory | None:
        """The last snapshot of ``session`` (of ``group``'s ``sample``), stored durably as its
        trajectory, trainable with ``reward`` (the job's failure reward; its masks were kept as
        built), or None when there is none to score: never posted, another sample's, or the
        session has its trajectory."""
        if not SAFE_SESSION.fullmatch(session):
            return None
        body = self.store.load_partial(session)
        if body is None:
            self.counts["agentFaultUnscored"] += 1
            log.warning(
                "session %s: ruled the agent's fault, but no snapshot of it is kept", session
            )
            return None
        if not (
            isinstance(body, dict)
            and body.get("session") == session
            and body.get("status") == "interrupted"
            and body.get("trainable") is False
            and body.get("group") == group
            and body.get("sample") == sample
        ):
            self.counts["agentFaultUnscored"] += 1
            log.warning(
                "session %s: ruled the agent's fault, but its snapshot is not an untrainable one"
                " of that session and sample (%s %s)",
                session,
                group,
                sample,
            )
            return None
        body["trainable"] = True
        body["reward"] = reward
        body["evaluation"] = {"reward": reward, "passed": False, "detail": {"agent_fault": why}}
        try:
            t = wire.parse(body)
        except wire.InvalidTrajectory as e:
            self.counts["agentFaultUnscored"] += 1
            log.warning(
                "session %s: ruled the agent's fault, but its snapshot is invalid: %s", session, e
            )
            return None
        # Stored as its trajectory (which deletes the snapshot), unless it has a trainable one:
        # an untrainable one its gateway shipped as its pod went gives way to the ruling.
        if not self.store.put(session, json.dumps(body).encode(), over_untrainable=True):
            return None
        self.counts["agentFault"] += 1
        return t


# Seconds a connection may stay silent (each read from it): a thread serves each connection,
# and sandbox pods may reach this port, so an agent's idle connections must not pile up until
# the gateways' own posts find no thread. A gateway's post sends as it connects.
IDLE_SECONDS = 60.0


# Rows of ``steps`` and ``sampled`` ``/v1/status`` gives a caller without the control token.
STATUS_ROWS = 20


def make_server(
    ingest: Ingest,
    address: tuple[str, int],
    status: Callable[[], dict],
    metrics: Callable[[], bytes] | None = None,
    finish: Callable[[], None] | None = None,
    control_token: str | None = None,
    ingest_token: str | None = None,
    failed: Callable[[str, int, str | None, str | None], dict] | None = None,
    fidelity: Callable[[list], dict] | None = None,
) -> http_limits.LimitedServer:
    class Handler(BaseHTTPRequestHandler):
        timeout = IDLE_SECONDS
        server: http_limits.LimitedServer

        def setup(self):
            super().setup()
            self.rfile = http_limits.HeadLimited(self.rfile)

        def handle_one_request(self):
            # Each request's head, keep-alive ones too, within its time and bytes.
            self.rfile.budget = http_limits.HEAD_BYTES
            self.server.head_started(self.connection)
            super().handle_one_request()

        def parse_request(self) -> bool:
            parsed = super().parse_request()
            self.server.head_done(self.connection)
            return parsed

        def _vouch(self):
            """The request carried a token of the server's: its connection leaves its peer's
            share (an agent holding its pod's cannot keep its own gateway out)."""
            self.server.vouch(self.connection, self.client_address[0])

        def _reply(self, code: int, body: dict | str, content_type: str = "application/json"):
            data = body.encode() if isinstance(body, str) else durable.strict_json(body).encode()
            self.send_response(code)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self) -> dict:
            """The trainer's status; its per-step rows and rewards by version whole only to a
            caller with the control token (``floe run``; the trainer's port is open to every
            sandbox pod of the job, and the lists grow with the run: an agent asking in a loop
            would have the trainer serialise megabytes each time), else their last
            :data:`STATUS_ROWS` (what the operator and a look with curl need)."""
            body = status()
            if not control_token or self._shows_control_token():
                return body
            for key in ("steps", "sampled"):
                rows = body.get(key)
                if isinstance(rows, list) and len(rows) > STATUS_ROWS:
                    body[key] = rows[-STATUS_ROWS:]
                    body[f"{key}Omitted"] = len(rows) - STATUS_ROWS
            return body

        def _shows_control_token(self) -> bool:
            given = self.headers.get("authorization") or ""
            return hmac.compare_digest(given.encode(), f"Bearer {control_token}".encode())

        def _controlled(self, what: str, handler) -> bool:
            """The control token's check; False (and the reply sent) when it fails."""
            if handler is None or not control_token:
                self._reply(403, {"error": f"{what} is disabled: no control token"})
                return False
            if not self._shows_control_token():
                self._reply(401, {"error": f"{what} needs the control token"})
                return False
            self._vouch()
            return True

        def _finish(self):
            if self._controlled("finish", finish):
                finish()
                self._reply(202, {"finishing": True})

        def _failed(self):
            if not self._controlled("failed", failed):
                return
            length = int(self.headers.get("content-length") or 0)
            try:
                body = json.loads(self.rfile.read(min(length, 65536)))
                group, sample = body["group"], body["sample"]
                session, why = body.get("session"), body.get("agentFault")
                if not isinstance(group, str) or not isinstance(sample, int) or sample < 0:
                    raise ValueError("group must be a string and sample a whole number >= 0")
                if (why is not None and session is None) or not all(
                    v is None or isinstance(v, str) for v in (session, why)
                ):
                    raise ValueError("session and agentFault are strings; agentFault names one")
            except (ValueError, KeyError, TypeError) as e:
                return self._reply(400, {"error": f'expected {{"group": G, "sample": S}}: {e}'})
            try:
                answer = failed(group, sample, session, why)
            except Exception as e:  # noqa: BLE001 (the caller hears why, in its own shape)
                return self._reply(500, {"error": f"the failed sample was not taken: {e}"})
            self._reply(202, {"group": group, "sample": sample, **answer})

        def _fidelity(self):
            if not self._controlled("fidelity", fidelity):
                return
            from .fidelity import parse_request

            length = int(self.headers.get("content-length") or 0)
            try:
                traces = parse_request(json.loads(self.rfile.read(min(length, 1 << 22))))
            except ValueError as e:
                return self._reply(400, {"error": str(e)})
            try:
                self._reply(200, fidelity(traces))
            except NotImplementedError as e:
                self._reply(501, {"error": str(e)})
            except Exception as e:  # noqa: BLE001 (the model's failure, in the caller's shape)
                self._reply(500, {"error": f"the fidelity check failed: {e}"})

        def do_POST(self):  # noqa: N802 (http.server's name)
            if self.path == "/v1/finish":
                return self._finish()
            if self.path == "/v1/failed":
                return self._failed()
            if self.path == "/v1/fidelity":
                return self._fidelity()
            if self.path not in ("/v1/trajectories", "/v1/partial", "/v1/partial/delta"):
                return self._reply(404, {"error": f"no route {self.path}"})
            given = self.headers.get("authorization") or ""
            if ingest_token and not hmac.compare_digest(
                given.encode(), f"Bearer {ingest_token}".encode()
            ):
                return self._reply(401, {"error": "ingest needs the job's ingest token"})
            if ingest_token:
                self._vouch()
            length = int(self.headers.get("content-length") or 0)
            if length > ingest.max_body_bytes:
                return self._reply(
                    413, {"error": f"body of {length} bytes > {ingest.max_body_bytes}"}
                )
            raw = self.rfile.read(length)
            if len(raw) != length:
                # The poster gave up mid-body: a snapshot kept unparsed would be a torn one.
                return self._reply(400, {"error": f"body of {len(raw)} bytes, not {length}"})
            if self.path.startswith("/v1/partial"):
                delta = self.path == "/v1/partial/delta"
                return self._reply(
                    *ingest.handle_partial(
                        self.headers.get("floe-session") or "",
                        self.headers.get("floe-calls") or "",
                        raw,
                        self.headers.get("floe-snapshot"),
                        (self.headers.get("floe-base-snapshot") or "") if delta else None,
                    )
                )
            code, body = ingest.handle(raw)
            self._reply(code, body)

        def do_GET(self):  # noqa: N802
            if self.path == "/healthz":
                return self._reply(200, "ok", "text/plain")
            if self.path == "/v1/status":
                return self._reply(200, self._status())
            if self.path == "/metrics" and metrics is not None:
                return self._reply(200, metrics().decode(), "text/plain; version=0.0.4")
            self._reply(404, {"error": f"no route {self.path}"})

        def log_message(self, format, *args):  # noqa: A002 (quiet by default)
            pass

    return http_limits.LimitedServer(address, Handler)
