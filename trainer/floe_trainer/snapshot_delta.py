"""A running session's snapshot sent as a change to the last one the trainer took.

A train job's gateway posts a snapshot of each session after every call (``POST
/v1/partial``). Posted whole, a session of ``n`` calls would send ``n`` times its size, and a
``per_request`` session's size itself grows with the square of its calls. So once the trainer
says it takes deltas (``"deltas": true`` in its answer), the gateway sends each next snapshot
as a delta (``POST /v1/partial/delta``; every snapshot has an id, ``Floe-Snapshot``, and a
delta names the one it is on in ``Floe-Base-Snapshot``)::

    {"format": "floe.snapshot-delta/v1", "base_calls": 4,
     "trajectory": {...the trajectory's own fields, "traces": []...},
     "traces": [{"same": 0},                       # the held trace 0, unchanged
                {"extends": 1, "response_token_ids": [...], "loss_mask": [...],
                 "logprobs": [...], "finish_reason": "stop", "completions": [...],
                 "start": "first"},                # held trace 1 grown by these tokens
                {"trace": {...}}]}                 # a trace whole

The ingest keeps deltas as they come, unparsed, beside the snapshot they build on, and
applies them (``apply_delta``) only when a ruling scores the session. The gateway's side is
``gateway/src/trajectory/snapshot_delta.rs``.
"""

from __future__ import annotations

DELTA_FORMAT = "floe.snapshot-delta/v1"

_GROWN = ("response_token_ids", "loss_mask", "logprobs")


class InvalidDelta(ValueError):
    pass


def apply_delta(held: dict, delta: dict) -> dict:
    """The snapshot ``delta`` describes, given the snapshot ``held`` it was planned against.
    Raises ``InvalidDelta`` when it is not one, or not against ``held``."""
    if not isinstance(delta, dict) or delta.get("format") != DELTA_FORMAT:
        raise InvalidDelta(f"not a {DELTA_FORMAT} body")
    stats = held.get("stats")
    held_calls = stats.get("completions") if isinstance(stats, dict) else None
    if delta.get("base_calls") != held_calls:
        raise InvalidDelta(
            f"a delta against {delta.get('base_calls')!r} calls, "
            f"applied to a snapshot of {held_calls!r}"
        )
    head, entries, old = delta.get("trajectory"), delta.get("traces"), held.get("traces")
    if not (isinstance(head, dict) and isinstance(entries, list) and isinstance(old, list)):
        raise InvalidDelta("a delta needs its trajectory and traces")
    traces = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise InvalidDelta(f"trace entry {entry!r} is not an object")
        if "same" in entry:
            traces.append(_held(old, entry["same"]))
        elif "extends" in entry:
            trace = dict(_held(old, entry["extends"]))
            for key in _GROWN:
                more = entry.get(key)
                if not isinstance(more, list) or not isinstance(trace.get(key), list):
                    raise InvalidDelta(f"an extension without {key}")
                trace[key] = trace[key] + more
            trace["completions"] = entry.get("completions")
            trace["start"] = entry.get("start")
            trace.pop("finish_reason", None)
            if entry.get("finish_reason") is not None:
                trace["finish_reason"] = entry["finish_reason"]
            traces.append(trace)
        elif "trace" in entry:
            traces.append(entry["trace"])
        else:
            raise InvalidDelta(f"trace entry with none of same, extends, trace: {list(entry)}")
    return {**head, "traces": traces}


def _held(old: list, index) -> dict:
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(old):
        raise InvalidDelta(f"no held trace {index!r} (of {len(old)})")
    return old[index]
