import math

import pytest
import torch

from floe_trainer.loss import KL_TOKEN_BOUND, LossConfig, policy_loss


def run(logp, old, behav, known, adv, mask, **cfg):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    lp = t(logp).requires_grad_(True)
    loss, stats = policy_loss(
        lp, t(old), t(behav), torch.tensor(known), t(adv), t(mask), LossConfig(**cfg)
    )
    loss.backward()
    return loss.item(), lp.grad, stats


def test_on_policy_first_step_is_minus_mean_advantage_over_tokens():
    # ratio 1, behaviour == old: loss = -sum(A * mask) / tokens.
    loss, grad, stats = run(
        [[-1.0, -2.0, -0.5]],
        [[-1.0, -2.0, -0.5]],
        [[-1.0, -2.0, -0.5]],
        [[True, True, True]],
        [2.0],
        [[1, 0, 1]],
    )
    assert loss == pytest.approx(-2.0)
    # d/dlogp of -A*exp(logp-old)/n at ratio 1 = -A/n on trained tokens, 0 on the masked one.
    assert grad[0].tolist() == pytest.approx([-1.0, 0.0, -1.0])
    assert stats.tokens == 2 and stats.clip_fraction == 0.0


def test_clip_higher_stops_the_gradient_past_1_plus_epsilon_high():
    # ratio e^0.4 = 1.49 > 1.28 with A > 0: clipped, no gradient; ratio e^0.1 = 1.105: not.
    loss, grad, stats = run(
        [[0.4 - 1.0, 0.1 - 1.0]],
        [[-1.0, -1.0]],
        [[-1.0, -1.0]],
        [[True, True]],
        [1.0],
        [[1, 1]],
    )
    assert loss == pytest.approx(-(1.28 + math.exp(0.1)) / 2)
    assert grad[0, 0].item() == 0.0
    assert grad[0, 1].item() == pytest.approx(-math.exp(0.1) / 2)
    assert stats.clip_fraction == pytest.approx(0.5)


def test_clip_low_applies_to_negative_advantages():
    # ratio e^-0.5 = 0.607 < 0.8 with A < 0: the clipped term (0.8 * -1) wins: loss 0.8.
    loss, grad, _ = run([[-1.5]], [[-1.0]], [[-1.0]], [[True]], [-1.0], [[1]])
    assert loss == pytest.approx(0.8)
    assert grad[0, 0].item() == 0.0


def test_the_dual_clip_bounds_a_negative_advantages_cost():
    # A < 0 and ratio e^1.5 = 4.48, past the clip's range: PPO's clip leaves the cost
    # |A| x ratio (the larger term wins); the dual clip stops it at |A| x 3, with no gradient.
    # Ratio e^0.5 = 1.65 is below 3: the cost is |A| x ratio, its gradient intact.
    ratios, old = [[0.5 - 1.0, 1.5 - 1.0]], [[-1.0, -1.0]]
    loss, grad, stats = run(ratios, old, old, [[True, True]], [-2.0], [[1, 1]])
    assert loss == pytest.approx((2.0 * math.exp(0.5) + 2.0 * 3.0) / 2)
    assert grad[0, 0].item() == pytest.approx(2.0 * math.exp(0.5) / 2)
    assert grad[0, 1].item() == 0.0
    assert stats.clip_dual_fraction == pytest.approx(0.5)
    # A looser bound leaves both unbounded; a positive advantage is never dual-clipped.
    loss, grad, stats = run(ratios, old, old, [[True, True]], [-2.0], [[1, 1]], dual_clip=10.0)
    assert loss == pytest.approx((2.0 * math.exp(0.5) + 2.0 * math.exp(1.5)) / 2)
    assert grad[0, 1].item() > 0 and stats.clip_dual_fraction == 0.0
    loss, _, stats = run(ratios, old, old, [[True, True]], [2.0], [[1, 1]])
    assert loss == pytest.approx(-2.0 * 1.28) and stats.clip_dual_fraction == 0.0
    # The bounded cost is weighed by the token's TIS weight like any other (here e^0.5).
    behaviour = [[-1.5, -1.5]]
    loss, _, _ = run(ratios, old, behaviour, [[True, True]], [-2.0], [[1, 1]])
    assert loss == pytest.approx(math.exp(0.5) * (2.0 * math.exp(0.5) + 2.0 * 3.0) / 2)


def test_truncated_importance_sampling_weights_by_the_capped_ratio():
    # old - behaviour = ln 1.5 -> weight 1.5; = ln 3 -> capped at 2; unknown -> 1.
    old = [[-1.0, -1.0, -1.0]]
    behav = [[-1.0 - math.log(1.5), -1.0 - math.log(3.0), 0.0]]
    loss, _, stats = run(old, old, behav, [[True, True, False]], [1.0], [[1, 1, 1]])
    assert loss == pytest.approx(-(1.5 + 2.0 + 1.0) / 3)
    assert stats.tis_mean == pytest.approx(1.75)
    assert stats.tis_truncated_fraction == pytest.approx(0.5)
    assert stats.behaviour_unknown == 1
    assert stats.tis_ess == pytest.approx(3.5**2 / (2 * (1.5**2 + 2.0**2)))
    assert stats.logprob_mismatch == pytest.approx((math.log(1.5) + math.log(3.0)) / 2)


def test_aggregations_differ_as_documented():
    # Two sequences: 1 token with A=1, 3 tokens with A=-1 (all on-policy).
    args = (
        [[-1.0, 0.0, 0.0, 0.0], [-1.0, -1.0, -1.0, 0.0]],
        [[-1.0, 0.0, 0.0, 0.0], [-1.0, -1.0, -1.0, 0.0]],
        [[-1.0, 0.0, 0.0, 0.0], [-1.0, -1.0, -1.0, 0.0]],
        [[True] * 4, [True] * 4],
        [1.0, -1.0],
        [[1, 0, 0, 0], [1, 1, 1, 0]],
    )
    token_mean, _, _ = run(*args, aggregation="TokenMean")
    seq_mean, _, _ = run(*args, aggregation="SequenceMean")
    sum_norm, _, _ = run(*args, aggregation="TokenSumNorm", sum_norm=4.0)
    assert token_mean == pytest.approx((-1 + 3) / 4)
    assert seq_mean == pytest.approx((-1 + 1) / 2)
    assert sum_norm == pytest.approx((-1 + 3) / (4.0 * 2))
    with pytest.raises(ValueError):
        run(*args, aggregation="Nope")


def test_kl_to_the_reference_is_the_k3_estimate_with_its_gradient():
    # A = 0: only the KL term. logp -1, ref -1.5: d = -0.5, k3 = e^-0.5 + 0.5 - 1; the masked
    # token adds nothing. d/dlogp (coef * k3) = coef * (1 - e^(ref - logp)).
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    lp = t([[-1.0, -2.0]]).requires_grad_(True)
    loss, stats = policy_loss(
        lp,
        t([[-1.0, -2.0]]),
        t([[-1.0, -2.0]]),
        torch.tensor([[True, True]]),
        t([0.0]),
        t([[1, 0]]),
        LossConfig(kl_coef=0.1),
        logp_ref=t([[-1.5, -9.0]]),
    )
    loss.backward()
    k3 = math.exp(-0.5) + 0.5 - 1
    assert loss.item() == pytest.approx(0.1 * k3)
    assert stats.kl_mean == pytest.approx(k3)
    assert lp.grad[0].tolist() == pytest.approx([0.1 * (1 - math.exp(-0.5)), 0.0])


def test_kl_needs_the_reference_logprobs():
    with pytest.raises(ValueError, match="reference"):
        run([[-1.0]], [[-1.0]], [[-1.0]], [[True]], [1.0], [[1]], kl_coef=0.1)


def test_kl_is_bounded_where_the_policy_left_the_reference_far_behind():
    # ref - logp = 50 would give exp(50) ~ 5e21 per token: the log-ratio is clamped to 20 and a
    # token's penalty to 10 (verl's low_var_kl), and it stays finite with a finite gradient.
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    lp = t([[-60.0, -1.0]]).requires_grad_(True)
    loss, stats = policy_loss(
        lp,
        t([[-60.0, -1.0]]),
        t([[-60.0, -1.0]]),
        torch.tensor([[True, True]]),
        t([0.0]),
        t([[1, 1]]),
        LossConfig(kl_coef=1.0),
        logp_ref=t([[-10.0, -1.0]]),
    )
    loss.backward()
    assert math.isfinite(loss.item())
    assert stats.kl_mean == pytest.approx((KL_TOKEN_BOUND + 0.0) / 2)
    assert all(math.isfinite(g) for g in lp.grad[0].tolist())
