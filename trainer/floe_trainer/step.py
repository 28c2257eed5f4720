"""One GRPO optimizer step over ready groups: each trajectory's advantage on every one of its
traces' sampled tokens, micro-batches with gradient accumulation, grad-norm clipping."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batching import Group
from .loss import LossConfig, policy_loss
from .placement import CPU_FP32, Placement
from .policy import make_batch, token_logprobs


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
) -> StepStats:
    """``reference``: the frozen policy the KL term (``cfg.kl_coef``) pulls towards."""
    items = [
        (trace, adv)
        for g in groups
        for t, adv in zip(g.trajectories, g.advantages, strict=True)
        for trace in t.traces
        if any(trace.loss_mask)
    ]
    total_tokens = sum(sum(tr.loss_mask) for tr, _ in items)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum, w = 0.0, []
    for start in range(0, len(items), micro_batch_size):
        chunk = items[start : start + micro_batch_size]
        batch = make_batch([tr for tr, _ in chunk], pad_id).to(placement.device)
        with placement.autocast():
            logp = token_logprobs(model, batch)
            ref = None
            if cfg.kl_coef > 0 and reference is not None:
                with torch.no_grad():
                    ref = token_logprobs(reference, batch)
        loss, stats = policy_loss(
            logp,
            logp.detach(),
            batch.behaviour,
            batch.behaviour_known,
            torch.tensor([a for _, a in chunk], dtype=torch.float64, device=placement.device),
            batch.loss_mask,
            cfg,
            ref,
        )
        # Token-mean over the whole step, not per micro-batch.
        share = stats.tokens / max(total_tokens, 1)
        (loss * share).backward()
        loss_sum += loss.item() * share
        w.append(stats)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    optimizer.step()
    tokens = sum(s.tokens for s in w) or 1
    rewards = [r for g in groups for r in g.rewards]
    return StepStats(
        loss=loss_sum,
        tokens=sum(s.tokens for s in w),
        sequences=len(items),
        grad_norm=grad_norm,
        clip_fraction=sum(s.clip_fraction * s.tokens for s in w) / tokens,
        tis_mean=sum(s.tis_mean * s.tokens for s in w) / tokens,
        tis_ess=min((s.tis_ess for s in w), default=1.0),
        logprob_mismatch=sum(s.logprob_mismatch * s.tokens for s in w) / tokens,
        reward_mean=sum(rewards) / max(len(rewards), 1),
        kl_mean=sum(s.kl_mean * s.tokens for s in w) / tokens,
    )
