"""The trajectory wire format (`floe.trajectory/v1`, docs/trajectory-format.md), validated.

A trajectory that breaks the format is refused whole with a message that says where; nothing
of it is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FORMAT = "floe.trajectory/v1"


class InvalidTrajectory(ValueError):
    """The body is not a usable floe trajectory; the message says why."""


@dataclass(frozen=True)
class Trace:
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    loss_mask: list[int]
    # Behaviour logprob per response token; None where unknown (interstitial tokens).
    logprobs: list[float | None]


@dataclass(frozen=True)
class Trajectory:
    session: str
    task: str
    group: str
    sample: int
    trainable: bool
    reward: float | None
    policy_versions: list[int]
    traces: list[Trace]
    # Calls cut at their token cap, not a short answer asked for (``stats.overlong_turns``):
    # with ``grpo.overlong: Mask`` the session's reward counts in its group, its tokens do not.
    overlong_turns: int = 0
    # The most tokens one call sampled, short caps the harness asked for aside
    # (``stats.longest_turn_tokens``): what ``grpo.overlongPenalty`` measures.
    longest_turn_tokens: int = 0


# The largest reward, either way, a trajectory may carry: far past any evaluator's scale, and
# far below where a group's advantages (squares of differences) would overflow a float and
# the trainer, replaying the same file after each restart, crash for good.
REWARD_LIMIT = 1e9


def _number(v: object) -> float | None:
    """``v`` as a finite float, unless it is a bool, not a number, or past a float (an
    integer of 400 digits: ``math.isfinite`` raises on it)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidTrajectory(message)


def _ints(value: object, where: str) -> list[int]:
    _require(isinstance(value, list), f"{where} must be an array")
    assert isinstance(value, list)
    for i, v in enumerate(value):
        _require(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            f"{where}[{i}] must be a token id (non-negative integer)",
        )
    return value


def parse_trace(t: object, where: str) -> Trace:
    _require(isinstance(t, dict), f"{where} must be an object")
    assert isinstance(t, dict)
    prompt = _ints(t.get("prompt_token_ids"), f"{where}.prompt_token_ids")
    # The first response token is predicted from the prompt's last position: without one, its
    # log-prob would be read from its own position, silently wrong.
    _require(len(prompt) > 0, f"{where}.prompt_token_ids must not be empty")
    response = _ints(t.get("response_token_ids"), f"{where}.response_token_ids")
    mask = t.get("loss_mask")
    _require(isinstance(mask, list), f"{where}.loss_mask must be an array")
    _require(len(mask) == len(response), f"{where}.loss_mask must match response_token_ids")
    _require(all(m in (0, 1) for m in mask), f"{where}.loss_mask holds only 0 and 1")
    logprobs = t.get("logprobs")
    _require(isinstance(logprobs, list), f"{where}.logprobs must be an array")
    _require(len(logprobs) == len(response), f"{where}.logprobs must match response_token_ids")
    for i, lp in enumerate(logprobs):
        number = _number(lp)
        _require(
            lp is None or (number is not None and number <= 0.0),
            f"{where}.logprobs[{i}] must be a log-probability (≤ 0) or null",
        )
    return Trace(
        prompt, response, list(mask), [None if lp is None else float(lp) for lp in logprobs]
    )


def parse(body: object) -> Trajectory:
    """Validate a decoded JSON body."""
    _require(isinstance(body, dict), "a trajectory is a JSON object")
    assert isinstance(body, dict)
    fmt = body.get("format")
    _require(fmt == FORMAT, f"format must be {FORMAT!r}, got {fmt!r}")
    for key in ("session", "task", "group"):
        _require(
            isinstance(body.get(key), str) and body[key] != "", f"{key} must be a non-empty string"
        )
    sample = body.get("sample")
    _require(
        isinstance(sample, int) and not isinstance(sample, bool) and sample >= 0,
        "sample must be a non-negative integer",
    )
    trainable = body.get("trainable")
    _require(isinstance(trainable, bool), "trainable must be a boolean")
    reward = body.get("reward")
    number = _number(reward)
    _require(
        reward is None or (number is not None and abs(number) <= REWARD_LIMIT),
        f"reward must be a finite number within ±{REWARD_LIMIT:g}, or null",
    )
    _require(not (trainable and reward is None), "a trainable trajectory needs a reward")
    versions = body.get("policy_versions", [])
    _ints(versions, "policy_versions")
    traces = body.get("traces")
    _require(isinstance(traces, list), "traces must be an array")
    assert isinstance(traces, list)
    stats = body.get("stats")
    stats = {} if stats is None else stats
    _require(isinstance(stats, dict), "stats must be an object")
    overlong = stats.get("overlong_turns", 0)
    longest = stats.get("longest_turn_tokens", 0)
    for name, value in (("overlong_turns", overlong), ("longest_turn_tokens", longest)):
        _require(
            isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            f"stats.{name} must be a non-negative integer",
        )
    return Trajectory(
        session=body["session"],
        task=body["task"],
        group=body["group"],
        sample=sample,
        trainable=trainable,
        reward=None if reward is None else float(reward),
        policy_versions=list(versions),
        traces=[parse_trace(t, f"traces[{i}]") for i, t in enumerate(traces)],
        overlong_turns=overlong,
        longest_turn_tokens=longest,
    )
