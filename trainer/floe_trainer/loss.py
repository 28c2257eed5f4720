"""The GRPO policy loss on padded token tensors: token-level PPO-clip with clip-higher and a
dual clip, truncated importance sampling (TIS) against the gateway's behaviour logprobs, and a
choice of aggregation. Shapes: ``[batch, tokens]`` for per-token tensors, ``[batch]`` for
advantages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The k3 KL estimator's bounds, as verl's ``low_var_kl``: the log-ratio to the reference, and
# one token's penalty.
KL_LOG_RATIO_BOUND = 20.0
KL_TOKEN_BOUND = 10.0


@dataclass(frozen=True)
class LossConfig:
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    # Dual clip: a token with a negative advantage costs at most this × |advantage|.
    dual_clip: float = 3.0
    tis_cap: float = 2.0
    # TokenMean (DAPO), SequenceMean (original GRPO) or TokenSumNorm (Dr. GRPO).
    aggregation: str = "TokenMean"
    # TokenSumNorm's constant (e.g. the maximum response length).
    sum_norm: float = 1024.0
    # Weight of the per-token KL penalty to a frozen reference policy (0: off, no reference).
    kl_coef: float = 0.0
    # The job's sampling temperature: every log-prob is of the tempered policy
    # (``policy.Batch.temperature``).
    temperature: float = 1.0


@dataclass(frozen=True)
class LossStats:
    tokens: int
    clip_fraction: float
    tis_mean: float
    tis_ess: float
    tis_truncated_fraction: float
    # Trained tokens without a behaviour logprob (no TIS correction for them).
    behaviour_unknown: int
    # Mean |trainer logprob - behaviour logprob| over tokens with both: the mismatch.
    logprob_mismatch: float
    # Mean per-token KL estimate to the reference policy (0 when there is none).
    kl_mean: float = 0.0
    # The clip split by side: the ratio above 1 + epsilon_high on a positive advantage (the
    # update would raise a token further), below 1 - epsilon_low on a negative one.
    clip_high_fraction: float = 0.0
    clip_low_fraction: float = 0.0
    # Tokens with a negative advantage whose ratio went past ``dual_clip``: their cost is
    # bounded there (and they give no gradient).
    clip_dual_fraction: float = 0.0
    # Mean entropy of the (tempered) policy over the sampled tokens' positions (first epoch's
    # passes; ``step.train_step`` fills it in).
    entropy: float = 0.0
    # Sum and sum of squares of the (capped) TIS weights over tokens with a behaviour
    # logprob: a step's effective sample size is of all its tokens, not the least of its
    # passes' (which would change with ``microBatchSize``).
    tis_sum: float = 0.0
    tis_sq_sum: float = 0.0

    @property
    def behaviour_known(self) -> int:
        return self.tokens - self.behaviour_unknown


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_behaviour: torch.Tensor,
    behaviour_known: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    logp_ref: torch.Tensor | None = None,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """``logp``: the policy being trained (with grad); ``logp_old``: the same policy before
    this step's updates (no grad); ``logp_behaviour``: what vLLM sampled with (from the
    trajectory), valid where ``behaviour_known``; ``mask``: 1 on sampled tokens;
    ``logp_ref``: the frozen reference policy, needed when ``cfg.kl_coef > 0``;
    ``row_weights`` ``[batch]``: each row's token weight in the whole mini-batch's loss
    (``aggregation_weights``), so that the loss is the mini-batch's share whatever the rows
    around it; unset, the rows are aggregated among themselves as ``cfg.aggregation`` says."""
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - logp_old.detach())
    clipped = torch.clamp(ratio, 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    # Dual clip (verl's ``clip_ratio_c``): on a negative advantage the clip above leaves the
    # cost |A| × ratio unbounded; it stops at |A| × dual_clip.
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * cfg.dual_clip), per_token)
    # TIS: the sample came from vLLM's policy, not exactly the trainer's; weight by the
    # (capped) ratio, 1 where the behaviour logprob is unknown.
    known = behaviour_known.to(torch.bool) & (mask > 0)
    raw_w = torch.where(known, torch.exp(logp_old.detach() - logp_behaviour), torch.ones_like(logp))
    w = torch.clamp(raw_w, max=cfg.tis_cap)
    per_token = per_token * w.detach()
    kl = torch.zeros_like(logp)
    if cfg.kl_coef > 0:
        if logp_ref is None:
            raise ValueError("kl_coef > 0 needs the reference policy's logprobs")
        # k3 estimator (Schulman): exp(ref - logp) - (ref - logp) - 1, unbiased and >= 0; it
        # is not importance-weighted, as in GRPO. Clamped as verl's low_var_kl is: a token the
        # policy has made far likelier than the reference would otherwise give exp(d) an
        # overflow, and one token's penalty the whole loss.
        d = torch.clamp(
            logp_ref.detach().to(logp.dtype) - logp, -KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND
        )
        kl = torch.clamp(torch.exp(d) - d - 1.0, max=KL_TOKEN_BOUND)
        per_token = per_token + cfg.kl_coef * kl
    per_token = per_token * mask

    n_tokens = mask.sum()
    if row_weights is not None:
        loss = (per_token * row_weights.to(logp.dtype).unsqueeze(-1)).sum()
    elif cfg.aggregation == "TokenMean":
        loss = per_token.sum() / n_tokens.clamp(min=1.0)
    elif cfg.aggregation == "SequenceMean":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)
        has = (mask.sum(-1) > 0).to(logp.dtype)
        loss = (per_seq * has).sum() / has.sum().clamp(min=1.0)
    elif cfg.aggregation == "TokenSumNorm":
        loss = per_token.sum() / (cfg.sum_norm * mask.shape[0])
    else:
        raise ValueError(f"unknown loss aggregation {cfg.aggregation!r}")

    with torch.no_grad():
        m = mask > 0
        tokens = int(m.sum().item())
        clipped_low = (ratio < 1.0 - cfg.epsilon_low) & (adv < 0)
        clipped_high = (ratio > 1.0 + cfg.epsilon_high) & (adv > 0)
        is_clipped = clipped_low | clipped_high
        dual = (ratio > cfg.dual_clip) & (adv < 0)
        wk = w[known]
        ess = float(wk.sum() ** 2 / (wk.numel() * (wk**2).sum())) if wk.numel() else 1.0
        stats = LossStats(
            tokens=tokens,
            clip_fraction=float(is_clipped[m].float().mean()) if tokens else 0.0,
            tis_mean=float(wk.mean()) if wk.numel() else 1.0,
            tis_ess=ess,
            tis_truncated_fraction=float((raw_w[known] > cfg.tis_cap).float().mean())
            if wk.numel()
            else 0.0,
            behaviour_unknown=int((m & ~known).sum().item()),
            logprob_mismatch=float((logp_old - logp_behaviour)[known].abs().mean())
            if wk.numel()
            else 0.0,
            kl_mean=float(kl[m].mean()) if tokens else 0.0,
            clip_high_fraction=float(clipped_high[m].float().mean()) if tokens else 0.0,
            clip_low_fraction=float(clipped_low[m].float().mean()) if tokens else 0.0,
            clip_dual_fraction=float(dual[m].float().mean()) if tokens else 0.0,
            tis_sum=float(wk.sum()),
            tis_sq_sum=float((wk**2).sum()),
        )
    return loss, stats


def aggregation_weights(
    aggregation: str, tokens: list[int], trajectories: list[int], sum_norm: float
) -> list[float]:
    """Each trace's token weight in one mini-batch's loss, for traces with ``tokens`` loss
    tokens each, of the trajectories ``trajectories`` names (a ``per_request`` trajectory has a
    trace per call). One normaliser for the whole mini-batch, so micro-batches, packing and
    processes change nothing (the loss of the mini-batch is the sum of its parts):

    - ``TokenMean`` (DAPO): 1 / the mini-batch's tokens;
    - ``SequenceMean`` (GRPO): each trajectory's tokens averaged, then the trajectories: 1 /
      (trajectories × that trajectory's tokens in the mini-batch);
    - ``TokenSumNorm`` (Dr. GRPO): 1 / (trajectories × ``sum_norm``), the constant being the
      longest response a call may sample, so no length is favoured."""
    total = sum(tokens)
    per_trajectory: dict[int, int] = {}
    for n, t in zip(tokens, trajectories, strict=True):
        per_trajectory[t] = per_trajectory.get(t, 0) + n
    count = max(len([t for t, n in per_trajectory.items() if n > 0]), 1)
    if aggregation == "TokenMean":
        return [1.0 / max(total, 1)] * len(tokens)
    if aggregation == "SequenceMean":
        return [1.0 / (count * max(per_trajectory[t], 1)) for t in trajectories]
    if aggregation == "TokenSumNorm":
        return [1.0 / (count * sum_norm)] * len(tokens)
    raise ValueError(f"unknown loss aggregation {aggregation!r}")
