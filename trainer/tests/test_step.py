"""One GRPO step on a tiny random model: the old log-probs are taken once before the first
update, so the PPO clip acts from the second update on (and never with a single update)."""

import pytest
import torch
from tiny import tiny_llama

from floe_trainer.batching import Group
from floe_trainer.loss import LossConfig
from floe_trainer.step import train_step
from floe_trainer.wire import Trace, Trajectory


def groups(n_groups=2, n=4):
    out = []
    g = torch.Generator().manual_seed(1)
    for gi in range(n_groups):
        trajs = []
        for s in range(n):
            prompt = torch.randint(1, 64, (6,), generator=g).tolist()
            resp = torch.randint(1, 64, (8,), generator=g).tolist()
            trace = Trace(prompt, resp, [1] * 8, [None] * 8)
            trajs.append(
                Trajectory(f"s{gi}{s}", "t", f"g{gi}", s, True, float(s % 2), [0], [trace])
            )
        out.append(Group(f"g{gi}", trajs, [1.0 if s % 2 else -1.0 for s in range(n)]))
    return out


def step(mini_batches, epochs, lr=0.05):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    cfg = LossConfig(epsilon_low=0.2, epsilon_high=0.28)
    return train_step(
        model, opt, groups(), cfg, micro_batch_size=2, mini_batches=mini_batches, epochs=epochs
    )


def test_one_update_is_on_policy_and_never_clips():
    s = step(1, 1)
    assert s.updates == 1
    assert s.clip_fraction == 0.0


def test_later_updates_see_the_policy_move_and_the_clip_acts():
    s = step(mini_batches=2, epochs=3)
    assert s.updates == 6
    assert s.clip_fraction > 0.0
    assert s.clip_fraction_last > 0.0
    # Every token is counted once in the step's totals, whatever the number of updates.
    assert s.tokens == 2 * 4 * 8 and s.sequences == 8


def test_more_mini_batches_than_sequences_is_one_update_per_sequence():
    s = step(mini_batches=100, epochs=1, lr=1e-4)
    assert s.updates == 8


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_first_updates_loss_is_the_on_policy_loss(epochs):
    # The reported loss is the first epoch's: comparable across steps whatever the epochs.
    a, b = step(1, 1, lr=0.0), step(1, epochs, lr=0.0)
    assert a.loss == pytest.approx(b.loss, abs=1e-9)


def test_micro_batches_hold_a_count_or_pack_by_tokens_with_long_traces_alone():
    from floe_trainer.step import micro_batches

    lengths = [5, 40, 7, 12, 100, 3]
    assert micro_batches(lengths, 4, None, int) == [[5, 40, 7, 12], [100, 3]]
    # Sorted by length; rows × the longest row stay within 30 tokens; at most 4 rows.
    packed = micro_batches(lengths, 4, 30, int)
    assert packed == [[3, 5, 7], [12], [40], [100]]
    for batch in packed:
        assert len(batch) == 1 or len(batch) * max(batch) <= 30
    assert micro_batches(lengths, 2, 1000, int) == [[3, 5], [7, 12], [40, 100]]
    assert micro_batches([], 4, 30, int) == []


def test_an_update_with_a_non_finite_gradient_is_skipped_and_counted():
    # A NaN advantage poisons the first mini-batch's gradient: that update is skipped (no NaN
    # reaches the optimizer or a weight), the next one is applied.
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    gs = groups()
    gs[0] = Group(gs[0].group, gs[0].trajectories, [float("nan")] * len(gs[0].advantages))
    s = train_step(model, opt, gs, LossConfig(), micro_batch_size=2, mini_batches=2, epochs=1)
    assert s.skipped_updates == 1 and s.updates == 1
    after = list(model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
