"""One GRPO step over ready groups (a rollout batch): each trajectory's advantage on every one
of its traces' sampled tokens. The batch's log-probabilities under the policy as it was before
the step (``logp_old``) are computed once, each first-epoch mini-batch in the passes its update
makes (the first update reads its own); then ``epochs`` passes over the batch, each split
into ``mini_batches`` optimizer updates (micro-batches with gradient accumulation inside each,
grad-norm clipping per update). With one update the PPO ratio is exactly 1 and the clip never
acts; from the second update on the policy has moved and the clip bounds how far."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch

from . import lora
from .batching import Group
from .distributed import SINGLE, World, gather, total
from .loss import LossConfig, LossStats, aggregation_weights, policy_loss
from .placement import CPU_FP32, Placement
from .policy import (
    Batch,
    make_batch,
    make_shared_batch,
    sharing_hidden,
    token_logprobs,
    token_logprobs_and_entropy,
    train_deterministically,
)
from .sharing import Pass, choose_passes, trie_batches
from .wire import Trace

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class StepStats:
    loss: float
    tokens: int
    sequences: int
    grad_norm: float
    clip_fraction: float
    tis_mean: float
    tis_ess: float
    logprob_mismatch: float
    reward_mean: float
    kl_mean: float = 0.0
    # Optimizer updates in this step (epochs × mini-batches).
    updates: int = 1
    # Clip fraction of the last update (the first one's is 0 by construction).
    clip_fraction_last: float = 0.0
    # Updates not applied: their gradient norm was not finite (an overflow, a NaN loss).
    skipped_updates: int = 0
    # The clip by side, over every update (see ``LossStats``).
    clip_fraction_high: float = 0.0
    clip_fraction_low: float = 0.0
    # Tokens of a negative advantage bounded by the dual clip, over every update.
    clip_fraction_dual: float = 0.0
    # Tokens whose importance weight was truncated at tisCap (first pass).
    tis_truncated_fraction: float = 0.0
    # Trained tokens the sampler gave no log-prob for (first epoch): they get no importance
    # weight, and the TIS figures above are of the others only (all of them ideal when none
    # has one). Above 0, the policy server is not answering with log-probs.
    behaviour_unknown_fraction: float = 0.0
    # The trajectories' advantages (after the group baseline).
    advantage_mean: float = 0.0
    advantage_std: float = 0.0
    # Sampled tokens per trace (its loss mask: a merged trace's tool output between its calls
    # is not counted), of every session in the step, masked ones included.
    response_tokens_mean: float = 0.0
    response_tokens_max: int = 0
    # The gradient norm of every update, before clipping (``grad_norm`` is the last).
    grad_norms: list[float] = field(default_factory=list)
    # The policy's mean entropy over the sampled tokens' positions (nats; first epoch). A
    # collapse towards 0 is the policy ceasing to explore (DAPO's clip-higher is against it).
    entropy: float = 0.0
    # Tokens the first epoch's passes computed (rows × width, padding included), against the
    # traces' own (prompt and response): below 1 where prompt sharing saved more than padding
    # cost.
    computed_tokens: int = 0
    trace_tokens: int = 0
    # Sessions in the step with a call cut at its token cap (``overlong_turns``), and
    # of those the ones whose loss was masked (``grpo.overlong: Mask``).
    overlong_sessions: int = 0
    masked_sessions: int = 0
    # Sessions whose advantage was taken with an overlong penalty (``grpo.overlongPenalty``),
    # and the penalty's mean over the step's sessions.
    penalized_sessions: int = 0
    overlong_penalty_mean: float = 0.0
    # Sessions (trajectories) in the step's groups.
    sessions: int = 0


@dataclass
class _Item:
    trace: Trace
    advantage: float
    # The trajectory the trace is of (its index in the step), for SequenceMean's average.
    trajectory: int = 0
    # Its token weight in the current mini-batch's loss (``aggregation_weights``).
    weight: float = 0.0
    # Per-response-token log-probabilities before the step ([R_i], float64, on CPU).
    logp_old: torch.Tensor | None = None
    # The KL reference's, once taken this step (same shape).
    logp_ref: torch.Tensor | None = None


@dataclass(frozen=True)
class _Layout:
    """How a step's traces become forward passes: the same for the old log-probs, the check of
    shared rows and the updates."""

    micro: int
    max_tokens: int | None
    pad_id: int
    temperature: float
    # The model's attention implementation (the form of a shared row's mask).
    attention: str
    # The hidden size shared rows are costed with; None: padded rows only.
    hidden: int | None = None

    def passes(
        self, items: list[T], trace_of: Callable[[T], Trace], bucket: bool = True
    ) -> list[Pass[T]]:
        return passes(items, self.micro, self.max_tokens, trace_of, self.hidden, bucket)

    def batch(self, p: Pass, traces: list[Trace]) -> Batch:
        if p.rows is None:
            return make_batch(traces, self.pad_id, self.temperature)
        return make_shared_batch(traces, p.rows, self.pad_id, self.temperature, self.attention)


def _old_logprobs(
    model: torch.nn.Module,
    items: list[_Item],
    minis: list[list[_Item]],
    layout: _Layout,
    placement: Placement,
    world: World,
    bucket: bool = True,
    swap: bool = True,
) -> None:
    """``logp_old`` of the items of ``minis`` (first-epoch mini-batches whose updates read
    them), each mini-batch scored in the very passes its update makes (per process, its
    share): the old log-probs then differ from the update's own by the policy's move alone,
    not by the numerics of another layout too (in bf16 enough to clip). Every process makes
    as many passes, and with ``swap`` they swap what they scored (later epochs shuffle the
    mini-batches, so a process trains traces another one scored)."""
    model.eval()
    index = {id(it): k for k, it in enumerate(items)}
    scored: list[tuple[int, torch.Tensor]] = []
    with torch.no_grad():
        for mini in minis:
            shares = [layout.passes(share, _trace_of, bucket) for share in world.shares(mini)]
            mine = shares[world.rank]
            for k in range(max(max(len(b) for b in shares), 1)):
                # A process with nothing left still makes the pass (FSDP's collectives).
                idle = k >= len(mine)
                chunk = Pass(mini[:1]) if idle else mine[k]
                batch = layout.batch(chunk, [it.trace for it in chunk.items])
                with placement.autocast():
                    logp = token_logprobs(model, batch.to(placement.device))
                if idle:
                    continue
                for row, it in enumerate(chunk.items):
                    n = len(it.trace.response_token_ids)
                    scored.append((index[id(it)], logp[row, :n].cpu()))
    # Without a later epoch each process trains only what it scored: nothing to swap.
    for part in gather(world, scored) if swap else [scored]:
        for k, logp in part:
            items[k].logp_old = logp


def _mini_batches(trajectories: list[list[_Item]], parts: int) -> list[list[_Item]]:
    """``parts`` mini-batches of whole trajectories, in order, as the items they hold."""
    return [[it for traj in part for it in traj] for part in _split(trajectories, parts)]


def micro_batches(
    items: list[T], micro: int, max_tokens: int | None, length, bucket: bool = True
) -> list[list[T]]:
    """Passes over ``items``: ``micro`` a pass, sorted by ``length`` (length bucketing: a pass
    pads every row to its longest, so like lengths together pad least; the gradient is the
    same sum in any order, each trace weighted by its mini-batch's normaliser); with
    ``max_tokens``, packed while rows × the longest row stay within it (a longer trace goes
    alone). ``bucket=False`` keeps ``items``' order (the benchmark's baseline)."""
    micro = max(micro, 1)
    if max_tokens is None:
        ordered = sorted(items, key=length) if bucket else items
        return [ordered[k : k + micro] for k in range(0, len(ordered), micro)]
    out: list[list[T]] = []
    longest = 0
    for it in sorted(items, key=length):
        n = length(it)
        current = out[-1] if out else []
        if current and len(current) < micro and (len(current) + 1) * max(longest, n) <= max_tokens:
            current.append(it)
            longest = max(longest, n)
        else:
            out.append([it])
            longest = n
    return out


def _trace_length(it: _Item) -> int:
    return _length(it.trace)


def _tokens(t: Trace) -> list[int]:
    return t.prompt_token_ids + t.response_token_ids


def _length(t: Trace) -> int:
    return len(t.prompt_token_ids) + len(t.response_token_ids)


def passes(
    items: list[T],
    micro: int,
    max_tokens: int | None,
    trace_of: Callable[[T], Trace],
    hidden: int | None,
    bucket: bool = True,
) -> list[Pass[T]]:
    """The passes over ``items``: length-bucketed padded rows, or, when ``hidden`` is given
    (the model takes shared rows) and it is cheaper, traces that begin alike in shared rows
    (``sharing``)."""
    bucketed = micro_batches(items, micro, max_tokens, lambda it: _length(trace_of(it)), bucket)
    if hidden is None:
        return [Pass(b) for b in bucketed]
    # Each item's tokens once (``id``: items need not be hashable; all live through the call).
    cache = {id(it): _tokens(trace_of(it)) for it in items}

    def tokens(it: T) -> list[int]:
        return cache[id(it)]

    trie = trie_batches(items, micro, max_tokens, tokens)
    return choose_passes(bucketed, trie, tokens, hidden)


def _attention(model: torch.nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "_attn_implementation", "sdpa"))


# The mean |difference| (nats per token) between a model's log-probs of traces in shared rows
# and in padded rows beyond which shared rows are not used with it. Measured in fp32 on CPU
# (SmolLM2): 3e-6 when the layouts agree, 0.32 with the mask ignored. bf16's rounding, with
# other attention kernels for the two layouts, is the larger (not yet measured on a GPU).
SHARING_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}


def _sharing_checked(
    model: torch.nn.Module,
    items: list[_Item],
    layout: _Layout,
    placement: Placement,
    world: World,
) -> int | None:
    """The hidden size ``passes`` lays out shared rows with, or None. The first time a step
    would share rows with a model, the first shared pass is computed both ways and compared
    (every process alike: the same items, the same passes); a model that gives other log-probs
    in shared rows is never given them again, with a warning."""
    hidden = sharing_hidden(model)
    verdict = getattr(model, _SHARING_VERDICT, None)
    if hidden is None or verdict is not None:
        return hidden if verdict in (None, True) else None
    layout = replace(layout, hidden=hidden)
    probe = next((p for p in layout.passes(items, _trace_of) if p.rows), None)
    if probe is None:
        return hidden
    traces = [it.trace for it in probe.items]
    was_training = model.training
    model.eval()
    with torch.no_grad(), placement.autocast():
        shared = token_logprobs(model, layout.batch(probe, traces).to(placement.device))
        padded = token_logprobs(model, layout.batch(Pass(probe.items), traces).to(placement.device))
    model.train(was_training)
    mask = torch.zeros_like(padded, dtype=torch.bool)
    for row, t in enumerate(traces):
        mask[row, : len(t.response_token_ids)] = True
    diff = float((shared - padded).abs()[mask].mean()) if bool(mask.any()) else 0.0
    ok = diff <= SHARING_TOLERANCE[placement.precision]
    if world.sharded:
        ok = total(world, 0.0 if ok else 1.0) == 0.0
    setattr(model, _SHARING_VERDICT, ok)
    if not ok:
        log.warning(
            "prompt sharing off for this model: its log-probs in shared rows differ from padded "
            "rows' by %.3g nats per token (tolerance %g); its attention may ignore a custom mask",
            diff,
            SHARING_TOLERANCE[placement.precision],
        )
        return None
    return hidden


_SHARING_VERDICT = "floe_shared_rows_verified"


def _trace_of(it: _Item) -> Trace:
    return it.trace


def _padded(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out.to(device)


def _split(items: list[T], parts: int) -> list[list[T]]:
    """`parts` slices in order, sizes differing by at most one: fixed slices of ceil(n/parts)
    made 3 updates of 6 trajectories out of `miniBatches: 4`, and left 1 trajectory alone to
    drive the last update of 10 at full step size."""
    n = len(items)
    parts = max(1, min(parts, n))
    return [items[i * n // parts : (i + 1) * n // parts] for i in range(parts)]


def reference_logprobs(
    model: torch.nn.Module, reference: torch.nn.Module | None, batch
) -> torch.Tensor | None:
    """The KL reference's log-probs of ``batch``: ``reference``'s own, or, for a LoRA policy
    (which loads none), the policy's with its adapter off: the base it started from, without a
    second copy of it in memory. None when there is no reference."""
    if reference is not None:
        return token_logprobs(reference, batch)
    if lora.adapted(model):
        with model.disable_adapter():
            return token_logprobs(model, batch)
    return None


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    groups: list[Group],
    cfg: LossConfig,
    micro_batch_size: int = 4,
    max_grad_norm: float = 1.0,
    pad_id: int = 0,
    placement: Placement = CPU_FP32,
    reference: torch.nn.Module | None = None,
    mini_batches: int = 1,
    epochs: int = 1,
    seed: int = 0,
    world: World = SINGLE,
    max_tokens_per_micro_batch: int | None = None,
    length_bucketing: bool = True,
    prompt_sharing: bool = True,
) -> StepStats:
    """``reference``: the frozen policy the KL term (``cfg.kl_coef``) pulls towards;
    ``seed``: the order of the mini-batches after the first epoch; ``world``: the processes
    that train together (each calls this with the same groups, see ``distributed``);
    ``length_bucketing``: passes of like-length traces ([micro_batches]; off only to measure
    what it saves); ``prompt_sharing``: traces that begin alike in shared rows where that is
    cheaper (``sharing``; off only to measure what it saves)."""
    trajectories = [
        (t, adv) for g in groups for t, adv in zip(g.trajectories, g.advantages, strict=True)
    ]
    masked = [
        m
        for g in groups
        for _, m in zip(g.trajectories, g.masked or [False] * len(g.trajectories), strict=True)
    ]
    # A masked session's reward is in its group's advantages; its traces are left out of the
    # loss and of every normaliser (its tokens, and the trajectories SequenceMean and
    # TokenSumNorm count).
    items = [
        _Item(trace, adv, index)
        for index, (t, adv) in enumerate(trajectories)
        if not masked[index]
        for trace in t.traces
        if any(trace.loss_mask)
    ]
    # Sampled tokens per trace, of every session in the step: the masked overlong ones too,
    # the longest, which a policy's length blow-up shows in first. (Sampled tokens only: a
    # merged trace's tool output between calls is not the policy's.)
    lengths = [
        sum(trace.loss_mask) for t, _ in trajectories for trace in t.traces if any(trace.loss_mask)
    ]
    counts = {
        "response_tokens_mean": sum(lengths) / max(len(lengths), 1),
        "response_tokens_max": max(lengths, default=0),
        "overlong_sessions": sum(t.overlong_turns > 0 for t, _ in trajectories),
        "masked_sessions": sum(masked),
        "sessions": len(trajectories),
        "penalized_sessions": sum(p > 0 for g in groups for p in g.penalties),
        "overlong_penalty_mean": sum(p for g in groups for p in g.penalties)
        / max(len(trajectories), 1),
    }
    rewards = [r for g in groups for r in g.rewards]
    if not items:
        # Nothing to train (every trace masked or empty): no update, the same weights.
        return StepStats(
            loss=0.0,
            tokens=0,
            sequences=0,
            grad_norm=0.0,
            clip_fraction=0.0,
            tis_mean=1.0,
            tis_ess=1.0,
            logprob_mismatch=0.0,
            reward_mean=sum(rewards) / max(len(rewards), 1),
            updates=0,
            **counts,
        )
    layout = _Layout(
        micro_batch_size, max_tokens_per_micro_batch, pad_id, cfg.temperature, _attention(model)
    )
    # The KL reference computes the same passes: it must take shared rows too.
    if prompt_sharing and items and (reference is None or sharing_hidden(reference)):
        layout = replace(layout, hidden=_sharing_checked(model, items, layout, placement, world))
    # Mini-batches hold whole trajectories: a per_request trajectory's traces split across
    # mini-batches would count as a trajectory in each (SequenceMean, TokenSumNorm).
    by_trajectory: dict[int, list[_Item]] = {}
    for it in items:
        by_trajectory.setdefault(it.trajectory, []).append(it)
    # The first update's policy is the one before the step, so its own passes' log-probs
    # (detached) are the old ones: its mini-batch is scored before the step only when a later
    # epoch trains it again. With one update no pass is made before it (a quarter of a step,
    # measured).
    first = _mini_batches(list(by_trajectory.values()), mini_batches)
    scored_before = first if epochs > 1 else first[1:]
    if scored_before:
        _old_logprobs(
            model, items, scored_before, layout, placement, world, length_bucketing, epochs > 1
        )
    train_deterministically(model)
    rng = random.Random(seed)
    all_stats: list[LossStats] = []
    first_epoch: list[LossStats] = []
    last_update: list[LossStats] = []
    loss_first_epoch, grad_norm, updates, skipped = 0.0, 0.0, 0, 0
    # The tokens of the first epoch's applied updates: the step's loss is their mean.
    loss_tokens = 0
    computed_tokens = 0
    grad_norms: list[float] = []
    for epoch in range(max(1, epochs)):
        if epoch == 0:
            minis = first
        else:
            order = list(by_trajectory.values())
            rng.shuffle(order)
            minis = _mini_batches(order, mini_batches)
        for part_index, mini in enumerate(minis):
            # The first update's policy is the one before the step: its own passes'
            # log-probs are the old ones exactly.
            first_update = epoch == 0 and part_index == 0
            mini_tokens = sum(sum(it.trace.loss_mask) for it in mini)
            # The whole mini-batch's normaliser, before it is split among processes and passes.
            weights = aggregation_weights(
                cfg.aggregation,
                [sum(it.trace.loss_mask) for it in mini],
                [it.trajectory for it in mini],
                cfg.sum_norm,
            )
            for it, w in zip(mini, weights, strict=True):
                it.weight = w
            shares = [
                layout.passes(share, _trace_of, length_bucketing) for share in world.shares(mini)
            ]
            mine = shares[world.rank]
            optimizer.zero_grad(set_to_none=True)
            # This update's figures, kept only if it is applied: a skipped one's loss and
            # statistics are those of the non-finite passes that made it skipped (NaN).
            update_loss, update_first, update_stats = 0.0, [], []
            for k in range(max(max(len(b) for b in shares), 1)):
                this = mine[k] if k < len(mine) else Pass(mini[:1])
                # A process with no trace left still makes the pass (FSDP's collectives run
                # in every forward and backward), with a loss that counts zero.
                idle = k >= len(mine)
                chunk = this.items
                batch = layout.batch(this, [it.trace for it in chunk]).to(placement.device)
                if epoch == 0 and not idle:
                    computed_tokens += batch.input_ids.numel()
                width = batch.response_ids.shape[1]
                with placement.autocast():
                    # The policy's entropy, measured on the first epoch's passes (its logits
                    # are there; later epochs' policies are already moved by this step).
                    entropy = None
                    if epoch == 0:
                        logp, entropy = token_logprobs_and_entropy(model, batch)
                    else:
                        logp = token_logprobs(model, batch)
                    ref = None
                    cached = not idle and all(it.logp_ref is not None for it in chunk)
                    if cfg.kl_coef > 0 and cached:
                        # The reference never moves: its log-probs of a trace are taken once
                        # a step, not once an epoch.
                        ref = _padded([it.logp_ref for it in chunk], width, placement.device)
                    elif cfg.kl_coef > 0:
                        with torch.no_grad():
                            ref = reference_logprobs(model, reference, batch)
                        # Kept in one process only: sharded, every process must make the same
                        # reference passes (their collectives), whatever it has seen before.
                        if ref is not None and not idle and not world.sharded:
                            for row, it in enumerate(chunk):
                                n = len(it.trace.response_token_ids)
                                it.logp_ref = ref[row, :n].detach().cpu()
                old = (
                    logp.detach()
                    if idle or first_update
                    else _padded([it.logp_old for it in chunk], width, placement.device)
                )
                loss, stats = policy_loss(
                    logp,
                    old,
                    batch.behaviour,
                    batch.behaviour_known,
                    torch.tensor(
                        [it.advantage for it in chunk], dtype=torch.float64, device=old.device
                    ),
                    batch.loss_mask,
                    cfg,
                    ref,
                    torch.tensor(
                        [0.0 if idle else it.weight for it in chunk],
                        dtype=torch.float64,
                        device=old.device,
                    ),
                )
                # Each row weighs its share of the whole mini-batch (every process's traces);
                # × the processes: FSDP averages their gradients, we sum them.
                (loss * world.size).backward()
                loss_value = loss.item()
                # Let this micro-batch's tensors go before the next one's forward: its
                # log-probs and loss hold its autograd graph, and with it what the checkpointed
                # head recomputed (0.5 GB of a 1,536-token micro-batch of SmolLM2, measured:
                # the second micro-batch's forward ran beside them).
                batch_mask = batch.loss_mask
                del logp, loss, old, ref, batch
                if idle:
                    continue
                if epoch == 0:
                    # The mini-batch's loss, weighted by its tokens for the step's figure.
                    update_loss += loss_value * mini_tokens
                    if entropy is not None and stats.tokens:
                        mask = batch_mask.to(entropy.dtype)
                        stats = replace(stats, entropy=float((entropy * mask).sum() / mask.sum()))
                    update_first.append(stats)
                update_stats.append(stats)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            # Sharded parameters give a DTensor norm (already over every process's shard), so
            # every process decides alike below.
            norm_value = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            if not math.isfinite(norm_value):
                # A NaN or infinite gradient would reach AdamW's moments and every weight, then
                # the push and the checkpoint: the update is skipped and counted instead.
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            if epoch == 0:
                # ``mini_tokens`` is the whole mini-batch's (every process's): added alike by
                # each, not summed across them.
                loss_first_epoch += update_loss
                loss_tokens += mini_tokens
            first_epoch += update_first
            all_stats += update_stats
            last_update = update_stats
            grad_norm = norm_value
            grad_norms.append(norm_value)
            optimizer.step()
            updates += 1
    if world.sharded:
        loss_first_epoch = total(world, loss_first_epoch)
        computed_tokens = int(total(world, float(computed_tokens)))
        all_stats, first_epoch, last_update = (
            [st for part in gather(world, kept) for st in part]
            for kept in (all_stats, first_epoch, last_update)
        )
    total_tokens = sum(sum(it.trace.loss_mask) for it in items)

    def mean(stats: list[LossStats], field: str) -> float:
        n = sum(s.tokens for s in stats) or 1
        return sum(getattr(s, field) * s.tokens for s in stats) / n

    # The TIS figures are of the tokens with a behaviour logprob: a pass with none (its 1.0
    # and 0.0 placeholders) weighed by all its tokens pulled them towards "no mismatch".
    known = sum(s.behaviour_known for s in first_epoch)

    def mean_known(field: str, none: float) -> float:
        if not known:
            return none
        return sum(getattr(s, field) * s.behaviour_known for s in first_epoch) / known

    w_sum = sum(s.tis_sum for s in first_epoch)
    w_sq = sum(s.tis_sq_sum for s in first_epoch)

    advantages = [adv for _, adv in trajectories]
    adv_mean = sum(advantages) / max(len(advantages), 1)
    adv_var = sum((a - adv_mean) ** 2 for a in advantages) / max(len(advantages), 1)
    return StepStats(
        loss=loss_first_epoch / max(loss_tokens, 1),
        tokens=total_tokens,
        sequences=len(items),
        grad_norm=grad_norm,
        clip_fraction=mean(all_stats, "clip_fraction"),
        tis_mean=mean_known("tis_mean", 1.0),
        tis_ess=w_sum**2 / (known * w_sq) if known and w_sq > 0 else 1.0,
        logprob_mismatch=mean_known("logprob_mismatch", 0.0),
        reward_mean=sum(rewards) / max(len(rewards), 1),
        kl_mean=mean(all_stats, "kl_mean"),
        updates=updates,
        clip_fraction_last=mean(last_update, "clip_fraction"),
        skipped_updates=skipped,
        clip_fraction_high=mean(all_stats, "clip_high_fraction"),
        clip_fraction_low=mean(all_stats, "clip_low_fraction"),
        clip_fraction_dual=mean(all_stats, "clip_dual_fraction"),
        tis_truncated_fraction=mean_known("tis_truncated_fraction", 0.0),
        behaviour_unknown_fraction=(
            sum(s.behaviour_unknown for s in first_epoch)
            / max(sum(s.tokens for s in first_epoch), 1)
        ),
        entropy=mean(first_epoch, "entropy"),
        advantage_mean=adv_mean,
        advantage_std=math.sqrt(adv_var),
        grad_norms=grad_norms,
        computed_tokens=computed_tokens,
        trace_tokens=sum(_trace_length(it) for it in items),
        **counts,
    )
