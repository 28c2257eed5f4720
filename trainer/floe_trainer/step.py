"""One GRPO step over ready groups (a rollout batch): each trajectory's advantage on every one
of its traces' sampled tokens. The batch's log-probabilities under the policy as it was before
the step (``logp_old``) are computed once; then ``epochs`` passes over the batch, each split
into ``mini_batches`` optimizer updates (micro-batches with gradient accumulation inside each,
grad-norm clipping per update). With one update the PPO ratio is exactly 1 and the clip never
acts; from the second update on the policy has moved and the clip bounds how far."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .batching import Group
from .loss import LossConfig, LossStats, policy_loss
from .placement import CPU_FP32, Placement
from .policy import make_batch, token_logprobs
from .wire import Trace


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


@dataclass
class _Item:
    trace: Trace
    advantage: float
    # Per-response-token log-probabilities before the step ([R_i], float64, on CPU).
    logp_old: torch.Tensor | None = None


def _old_logprobs(
    model: torch.nn.Module, items: list[_Item], micro: int, pad_id: int, placement: Placement
) -> None:
    model.eval()
    with torch.no_grad():
        for start in range(0, len(items), micro):
            chunk = items[start : start + micro]
            batch = make_batch([it.trace for it in chunk], pad_id).to(placement.device)
            with placement.autocast():
                logp = token_logprobs(model, batch).cpu()
            for row, it in enumerate(chunk):
                it.logp_old = logp[row, : len(it.trace.response_token_ids)]


def _padded(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out.to(device)


def _split(items: list[_Item], parts: int) -> list[list[_Item]]:
    parts = max(1, min(parts, len(items)))
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)]


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
) -> StepStats:
    """``reference``: the frozen policy the KL term (``cfg.kl_coef``) pulls towards;
    ``seed``: the order of the mini-batches after the first epoch."""
    items = [
        _Item(trace, adv)
        for g in groups
        for t, adv in zip(g.trajectories, g.advantages, strict=True)
        for trace in t.traces
        if any(trace.loss_mask)
    ]
    # One update: the policy before it is the policy in it, so its own log-probs (detached)
    # are the old ones and the extra forward pass is saved (a quarter of a step, measured).
    on_policy = max(1, epochs) * min(max(1, mini_batches), max(1, len(items))) == 1
    if not on_policy:
        _old_logprobs(model, items, micro_batch_size, pad_id, placement)
    model.train()
    rng = random.Random(seed)
    all_stats: list[LossStats] = []
    last_update: list[LossStats] = []
    loss_first_epoch, grad_norm, updates = 0.0, 0.0, 0
    for epoch in range(max(1, epochs)):
        order = list(items)
        if epoch > 0:
            rng.shuffle(order)
        for mini in _split(order, mini_batches):
            mini_tokens = sum(sum(it.trace.loss_mask) for it in mini)
            optimizer.zero_grad(set_to_none=True)
            last_update = []
            for start in range(0, len(mini), micro_batch_size):
                chunk = mini[start : start + micro_batch_size]
                batch = make_batch([it.trace for it in chunk], pad_id).to(placement.device)
                width = batch.response_ids.shape[1]
                with placement.autocast():
                    logp = token_logprobs(model, batch)
                    ref = None
                    if cfg.kl_coef > 0 and reference is not None:
                        with torch.no_grad():
                            ref = token_logprobs(reference, batch)
                old = (
                    logp.detach()
                    if on_policy
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
                )
                # Token-mean over the whole mini-batch, not per micro-batch.
                share = stats.tokens / max(mini_tokens, 1)
                (loss * share).backward()
                if epoch == 0:
                    loss_first_epoch += loss.item() * stats.tokens
                last_update.append(stats)
                all_stats.append(stats)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
            optimizer.step()
            updates += 1
    total_tokens = sum(sum(it.trace.loss_mask) for it in items)

    def mean(stats: list[LossStats], field: str) -> float:
        n = sum(s.tokens for s in stats) or 1
        return sum(getattr(s, field) * s.tokens for s in stats) / n

    first_epoch = all_stats[: len(all_stats) // max(1, epochs)] if all_stats else []
    rewards = [r for g in groups for r in g.rewards]
    return StepStats(
        loss=loss_first_epoch / max(total_tokens, 1),
        tokens=total_tokens,
        sequences=len(items),
        grad_norm=grad_norm,
        clip_fraction=mean(all_stats, "clip_fraction"),
        tis_mean=mean(first_epoch, "tis_mean"),
        tis_ess=min((s.tis_ess for s in first_epoch), default=1.0),
        logprob_mismatch=mean(first_epoch, "logprob_mismatch"),
        reward_mean=sum(rewards) / max(len(rewards), 1),
        kl_mean=mean(all_stats, "kl_mean"),
        updates=updates,
        clip_fraction_last=mean(last_update, "clip_fraction"),
    )
