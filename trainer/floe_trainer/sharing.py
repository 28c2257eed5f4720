"""Prompt sharing: traces of one pass that begin alike are laid out in one row as the tree of
their tokens, each token once (pure: lists in, layouts out; ``policy.make_shared_batch``
turns a layout into tensors).

GRPO samples each task's prompt ``numSamples`` times, and an agent's prompt (system prompt,
tool schemas, the task) is most of a trace's tokens; a ``per_request`` trajectory's calls
repeat the conversation so far. Padded rows compute those tokens once per trace. A shared row
holds its first member whole, then each next member's tokens after the beginning it has in
common with the one before (in lexicographic order, the most it has in common with any
before it): a prefix tree, depth first. A token attends to the tokens on its own path from
the root only (a 4-D mask), at the position its depth gives: every log-prob is the one the
trace has alone (tested), from fewer tokens. Rows are then packed: trees side by side in a
row no wider than the pass's widest (``pack``), so short traces stop costing a padded row
each.

A row's attention is dense (SDPA with a mask scores every pair in it), so a wide row costs
quadratically: a trace joins a row only while the estimated cost of the row with it is below
the row's without it plus the trace's own (``row_cost``), and a pass is laid out shared only
when that is cheaper than its padded rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# A shared layout is taken only when it saves at least this share of the padded layout's cost:
# the estimate is rough, and a masked attention cannot take the causal kernels' shortcuts.
MIN_SAVING = 0.1


@dataclass(frozen=True)
class Row:
    """One row of a shared pass: ``members`` (indices into the pass's traces) in layout order;
    ``shared[k]``, the tokens member k begins with in common with member k-1 (0 for the first),
    which it takes from that member's path; ``width``, the tokens the row holds."""

    members: tuple[int, ...]
    shared: tuple[int, ...]
    width: int


@dataclass
class Pass(Generic[T]):
    """A forward (and backward) pass's items; ``rows`` when they are laid out shared, else
    None (one padded row each)."""

    items: list[T]
    rows: list[Row] | None = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The tokens ``a`` and ``b`` begin with in common. Agent prompts run to tens of thousands
    of tokens: they are compared a block at a time (a slice comparison runs in C), then token
    by token within the first block that differs."""
    n = min(len(a), len(b))
    i = 0
    while i + _BLOCK <= n and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
        i += _BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


_BLOCK = 256


def row_cost(width: int, hidden: int) -> float:
    """Relative compute of a row of ``width`` tokens: per token and layer, the projections and
    the MLP (~24·h² FLOPs) and the attention over the row (~4·width·h), divided by 4h, with
    the attention weighed 1.5× its FLOPs: measured on CPU (SmolLM2, fp32, forward and
    backward under a 4-D mask), a row's time per token grows with its width 1.5× as fast as
    the FLOP count says (the attention kernel runs below the matrix products' speed)."""
    return width * (4 * hidden + width)


def padded_cost(lengths: Sequence[int], hidden: int) -> float:
    return len(lengths) * row_cost(max(lengths, default=0), hidden)


def shared_cost(rows: Sequence[Row], hidden: int) -> float:
    return len(rows) * row_cost(max((r.width for r in rows), default=0), hidden)


def plan_rows(seqs: Sequence[Sequence[int]], hidden: int) -> list[Row]:
    """Rows over ``seqs`` (each a trace's prompt and response tokens), greedily in the given
    order: callers sort them lexicographically, so that a sequence's common beginning with the
    one before it is the longest it has with any before it. A sequence joins the current row
    while that is cheaper than a row of its own."""
    rows: list[Row] = []
    members: list[int] = []
    shared: list[int] = []
    width = 0
    for i, s in enumerate(seqs):
        if members:
            common = common_prefix(seqs[members[-1]], s)
            grown = width + len(s) - common
            if common > 0 and row_cost(grown, hidden) < row_cost(width, hidden) + row_cost(
                len(s), hidden
            ):
                members.append(i)
                shared.append(common)
                width = grown
                continue
            rows.append(Row(tuple(members), tuple(shared), width))
        members, shared, width = [i], [0], len(s)
    if members:
        rows.append(Row(tuple(members), tuple(shared), width))
    return rows


def pack(rows: list[Row]) -> list[Row]:
    """``rows`` merged into as few as fit the widest (first fit, widest first). A pass pads
    every row to its widest, and a row's dense attention costs its width squared whatever it
    holds, so trees side by side in one row (each attending to itself only: a member that
    shares nothing with the one before starts a tree of its own) cost no more than apart, and
    the rows they leave cost nothing. Packing never makes a row wider than the pass's widest,
    so it is never dearer."""
    width = max((r.width for r in rows), default=0)
    bins: list[list[Row]] = []
    loads: list[int] = []
    for r in sorted(rows, key=lambda r: -r.width):
        fit = next((k for k, load in enumerate(loads) if load + r.width <= width), None)
        if fit is None:
            bins.append([r])
            loads.append(r.width)
        else:
            bins[fit].append(r)
            loads[fit] += r.width
    return [
        Row(
            tuple(m for r in b for m in r.members),
            tuple(c for r in b for c in r.shared),
            sum(r.width for r in b),
        )
        for b in bins
    ]


def layout(seqs: Sequence[Sequence[int]], hidden: int) -> list[Row] | None:
    """The rows of one pass (``seqs`` in the pass's order): traces that begin alike shared
    (``plan_rows``), rows packed (``pack``); or None when padded rows cost no more. Never
    more query-key pairs than the padded rows (rows × width² against traces × longest²): the
    mask and, on CPU, the attention scores stay within what the memory plan counts for a
    pass."""
    rows = pack(plan_rows(seqs, hidden))
    if len(rows) == len(seqs):
        return None
    width = max(r.width for r in rows)
    if len(rows) * width * width > len(seqs) * max(len(s) for s in seqs) ** 2:
        return None
    padded = padded_cost([len(s) for s in seqs], hidden)
    if shared_cost(rows, hidden) > (1 - MIN_SAVING) * padded:
        return None
    return rows


def trie_batches(
    items: list[T], micro: int, max_tokens: int | None, tokens: Callable[[T], Sequence[int]]
) -> list[list[T]]:
    """Passes of ``items`` in lexicographic order of their tokens (traces that begin alike
    side by side): ``micro`` a pass, or, with ``max_tokens``, while the tokens a shared row
    would hold (each item's beyond its common beginning with the one before) stay within it."""
    ordered = sorted(items, key=lambda it: list(tokens(it)))
    micro = max(micro, 1)
    if max_tokens is None:
        return [ordered[k : k + micro] for k in range(0, len(ordered), micro)]
    out: list[list[T]] = []
    held = 0
    for it in ordered:
        s = tokens(it)
        new = len(s) - (common_prefix(tokens(out[-1][-1]), s) if out and out[-1] else 0)
        if out and len(out[-1]) < micro and held + new <= max_tokens:
            out[-1].append(it)
            held += new
        else:
            out.append([it])
            held = len(s)
    return out


def choose_passes(
    bucketed: list[list[T]],
    trie: list[list[T]],
    tokens: Callable[[T], Sequence[int]],
    hidden: int | None,
) -> list[Pass[T]]:
    """The cheaper of two ways to make the passes: ``bucketed`` (like lengths together) or
    ``trie`` (like beginnings together), each pass laid out in shared and packed rows where
    that is cheaper than padded ones (``layout``). ``hidden`` None: padded rows only (the
    model cannot take a custom mask)."""
    if hidden is None:
        return [Pass(b) for b in bucketed]
    plain, plain_cost = _laid_out(bucketed, tokens, hidden)
    shared, cost = _laid_out(trie, tokens, hidden)
    return shared if cost < plain_cost else plain


def _laid_out(
    batches: list[list[T]], tokens: Callable[[T], Sequence[int]], hidden: int
) -> tuple[list[Pass[T]], float]:
    out: list[Pass[T]] = []
    cost = 0.0
    for b in batches:
        seqs = [tokens(it) for it in b]
        rows = layout(seqs, hidden)
        out.append(Pass(b, rows))
        cost += shared_cost(rows, hidden) if rows else padded_cost([len(s) for s in seqs], hidden)
    return out, cost
