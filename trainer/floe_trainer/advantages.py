"""Group-relative advantages (pure Python; one reward per session of a GRPO group)."""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-6


def group_advantages(rewards: Sequence[float], estimator: str = "MeanStd") -> list[float]:
    """Advantages of a group's sessions.

    - ``MeanStd`` (GRPO): ``(r - mean) / (std + eps)``, population std.
    - ``MeanOnly`` (Dr. GRPO): ``r - mean``, no std normalization (no difficulty bias).
    - ``LeaveOneOut`` (RLOO): ``r - mean of the other samples``.
    """
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    if estimator == "MeanStd":
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
        return [(r - mean) / (std + EPS) for r in rewards]
    if estimator == "MeanOnly":
        return [r - mean for r in rewards]
    if estimator == "LeaveOneOut":
        if n == 1:
            return [0.0]
        total = sum(rewards)
        return [r - (total - r) / (n - 1) for r in rewards]
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def uniform(rewards: Sequence[float]) -> bool:
    """All rewards equal: every advantage is 0 and the group teaches nothing."""
    return len(rewards) > 0 and max(rewards) - min(rewards) < 1e-12


def overlong_penalty(longest: int, cap: int | None, buffer: int | None, factor: float) -> float:
    """DAPO's soft overlong punishment (``grpo.overlongPenalty``): 0 while a session's longest
    call stayed ``buffer`` tokens or more below the job's ``cap``, then growing linearly to
    ``factor`` at the cap (a call the cap cut). 0 without a buffer or a cap."""
    if not buffer or not cap:
        return 0.0
    into = longest - (cap - buffer)
    return factor * min(1.0, into / buffer) if into > 0 else 0.0
