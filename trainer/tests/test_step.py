"""One GRPO step on a tiny random model: the old log-probs are taken once before the first
update, so the PPO clip acts from the second update on (and never with a single update)."""

import dataclasses
import math

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


def test_the_first_update_takes_its_own_passes_log_probs_as_the_old_ones(monkeypatch):
    # Before the step, in passes laid out for the whole step, a trace's log-probs differ from
    # the first update's own passes by the numerics of another layout (in bf16 enough to clip):
    # stood for here by shifting them. The first update's ratio is exactly 1 all the same.
    from floe_trainer import step as step_module

    real_old, real_loss = step_module._old_logprobs, step_module.policy_loss

    def shifted(model, items, *a, **k):
        real_old(model, items, *a, **k)
        for it in items:
            if it.logp_old is not None:
                it.logp_old = it.logp_old + 0.5

    ratios = []

    def loss(logp, logp_old, *a, **k):
        ratios.append(float((logp.detach() - logp_old).abs().max()))
        return real_loss(logp, logp_old, *a, **k)

    monkeypatch.setattr(step_module, "_old_logprobs", shifted)
    monkeypatch.setattr(step_module, "policy_loss", loss)
    s = step(mini_batches=2, epochs=1)
    first = len(ratios) // 2  # the passes of the first of two mini-batches
    assert s.updates == 2
    assert max(ratios[:first]) == 0.0, ratios
    assert min(ratios[first:]) > 0.4, "the second update reads the old log-probs taken before"


def uneven_groups(n_groups=4, n=4, shared=False):
    """Groups of traces of uneven lengths; ``shared``: a group's samples share one long prompt
    (the trainer's prompt sharing may then put them in shared rows)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for gi in range(n_groups):
        trajs = []
        common = torch.randint(1, 64, (48,), generator=g)
        for s in range(n):
            width = int(torch.randint(3, 12, (1,), generator=g))
            prompt = common if shared else torch.randint(1, 64, (width,), generator=g)
            size = int(torch.randint(2, 14, (1,), generator=g))
            resp = torch.randint(1, 64, (size,), generator=g).tolist()
            trace = Trace(prompt.tolist(), resp, [1] * size, [None] * size)
            trajs.append(
                Trajectory(f"s{gi}{s}", "t", f"g{gi}", s, True, float(s % 2), [0], [trace])
            )
        out.append(Group(f"g{gi}", trajs, [1.0 if s % 2 else -1.0 for s in range(n)]))
    return out


@pytest.mark.parametrize(
    "epochs, options",
    [
        (1, {}),
        (2, {}),
        (1, {"length_bucketing": False}),
        (2, {"max_tokens_per_micro_batch": 40}),
        (1, {"shared_prompt": True}),
    ],
)
def test_the_old_log_probs_are_taken_in_the_passes_their_updates_make(monkeypatch, epochs, options):
    # A pass's numerics depend on its layout (which rows, padded to what): scored in passes
    # laid out for the whole step, a trace's old log-probs differed from its update's own by
    # more than the policy's move. Each first-epoch mini-batch is scored in its update's very
    # passes, and the first one not at all unless a later epoch trains it again.
    from floe_trainer import step as step_module

    phase, passes, update = ["before"], {"old": [], "train": []}, [0]
    real_old = step_module._old_logprobs
    real_lp, real_lpe = step_module.token_logprobs, step_module.token_logprobs_and_entropy

    def old(*a, **k):
        phase[0] = "old"
        real_old(*a, **k)
        phase[0] = "train"

    def record(batch):
        if phase[0] != "before":
            passes[phase[0]].append((update[0], sorted(map(tuple, batch.input_ids.tolist()))))

    def lp(model, batch, *a, **k):
        record(batch)
        return real_lp(model, batch, *a, **k)

    def lpe(model, batch, *a, **k):
        record(batch)
        return real_lpe(model, batch, *a, **k)

    monkeypatch.setattr(step_module, "_old_logprobs", old)
    monkeypatch.setattr(step_module, "token_logprobs", lp)
    monkeypatch.setattr(step_module, "token_logprobs_and_entropy", lpe)
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    real_step = opt.step

    def counted(*a, **k):
        update[0] += 1
        return real_step(*a, **k)

    opt.step = counted
    options = dict(options)
    groups = uneven_groups(shared=options.pop("shared_prompt", False))
    s = train_step(
        model,
        opt,
        groups,
        LossConfig(),
        micro_batch_size=3,
        mini_batches=2,
        epochs=epochs,
        **options,
    )
    assert s.updates == 2 * epochs
    scored = [rows for _, rows in passes["old"]]
    by_update = [[rows for u, rows in passes["train"] if u == k] for k in range(2)]
    # The first update's passes are scored before the step only when epoch 2 trains them.
    expected = by_update[0] + by_update[1] if epochs > 1 else by_update[1]
    assert by_update[0] and by_update[1] and scored == expected


def test_later_updates_see_the_policy_move_and_the_clip_acts():
    s = step(mini_batches=2, epochs=3)
    assert s.updates == 6
    assert s.clip_fraction > 0.0
    assert s.clip_fraction_last > 0.0
    # Every token is counted once in the step's totals, whatever the number of updates.
    assert s.tokens == 2 * 4 * 8 and s.sequences == 8
    # What a practitioner reads: the clip by side (disjoint: a side per advantage sign), every
    # update's gradient norm, the advantages and response lengths of the batch.
    assert s.clip_fraction == pytest.approx(s.clip_fraction_high + s.clip_fraction_low)
    assert s.clip_fraction_high > 0 and s.clip_fraction_low > 0
    assert len(s.grad_norms) == s.updates and s.grad_norms[-1] == s.grad_norm
    assert (s.advantage_mean, s.advantage_std) == (0.0, 1.0)
    assert (s.response_tokens_mean, s.response_tokens_max) == (8.0, 8)


def test_the_step_reports_the_policys_entropy_over_the_sampled_positions():
    from floe_trainer.policy import make_batch

    gs = groups()
    model = tiny_llama()
    # What the policy before the step gives each sampled position, computed directly.
    traces = [t for g in gs for traj in g.trajectories for t in traj.traces]
    b = make_batch(traces)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        rows = torch.gather(
            logits, 1, b.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        ).log_softmax(-1)
        per_position = -(rows.exp() * rows).sum(-1)
        expected = float(per_position[b.loss_mask.bool()].mean())
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    s = train_step(model, opt, gs, LossConfig(), micro_batch_size=2)
    assert s.entropy == pytest.approx(expected, rel=1e-4)
    # A random 64-token policy is close to uniform: near log(64), never above.
    assert 0.5 * math.log(64) < s.entropy <= math.log(64)


def test_more_mini_batches_than_sequences_is_one_update_per_sequence():
    s = step(mini_batches=100, epochs=1, lr=1e-4)
    assert s.updates == 8


@pytest.mark.parametrize(
    ("n", "parts", "sizes"),
    [
        (6, 4, [1, 2, 1, 2]),
        (10, 4, [2, 3, 2, 3]),
        (60, 8, [7, 8, 7, 8, 7, 8, 7, 8]),
        (3, 8, [1] * 3),
    ],
)
def test_mini_batches_are_as_many_as_asked_and_even(n, parts, sizes):
    # ceil-sized slices made [2, 2, 2] of 6 (three updates, not four) and [3, 3, 3, 1] of 10.
    from floe_trainer.step import _split

    split = _split(list(range(n)), parts)
    assert [len(p) for p in split] == sizes
    assert [x for p in split for x in p] == list(range(n))


def test_an_uneven_step_makes_every_update_it_was_asked_for():
    # 8 trajectories in 6 mini-batches: ceil-sized slices of 2 made 4 updates a epoch.
    s = step(mini_batches=6, epochs=2, lr=1e-4)
    assert s.updates == 12 and len(s.grad_norms) == 12


def test_the_tis_figures_are_of_the_known_tokens_whatever_the_micro_batches():
    # Half the trajectories carry vLLM's log-probs (half of them far from the policy's, so the
    # cap truncates them), half none: one pass each weighed the unknown ones' placeholders
    # (ratio 1, mismatch 0) by all their tokens, and the ESS was the least pass's.
    def with_behaviour(gs):
        out = []
        for g in gs:
            trajs = []
            for i, t in enumerate(g.trajectories):
                tr = t.traces[0]
                lp = [-3.0] * 4 + [-6.0] * 4 if i % 2 == 0 else [None] * 8
                trace = Trace(tr.prompt_token_ids, tr.response_token_ids, tr.loss_mask, lp)
                trajs.append(
                    Trajectory(
                        t.session,
                        t.task,
                        t.group,
                        t.sample,
                        True,
                        t.reward,
                        t.policy_versions,
                        [trace],
                    )
                )
            out.append(Group(g.group, trajs, g.advantages))
        return out

    def figures(micro):
        model = tiny_llama()
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        s = train_step(model, opt, with_behaviour(groups()), LossConfig(), micro_batch_size=micro)
        figures = (s.tis_mean, s.tis_ess, s.logprob_mismatch, s.tis_truncated_fraction)
        return (*figures, s.behaviour_unknown_fraction)

    whole, one_by_one = figures(8), figures(1)
    assert whole == pytest.approx(one_by_one, rel=1e-6)
    # A random 64-token policy gives about -log(64) = -4.16: about 1.2 nats from either.
    assert 0.9 < whole[2] < 1.6
    assert whole[3] == pytest.approx(0.5, abs=0.15)
    # Half the trajectories came without log-probs: said, not hidden behind ideal TIS figures.
    assert whole[4] == pytest.approx(0.5)


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_first_updates_loss_is_the_on_policy_loss(epochs):
    # The reported loss is the first epoch's: comparable across steps whatever the epochs.
    a, b = step(1, 1, lr=0.0), step(1, epochs, lr=0.0)
    assert a.loss == pytest.approx(b.loss, abs=1e-9)


def test_micro_batches_hold_a_count_or_pack_by_tokens_with_long_traces_alone():
    from floe_trainer.step import micro_batches

    lengths = [5, 40, 7, 12, 100, 3]
    # Length bucketing: like lengths in one pass (each pads to its longest row).
    assert micro_batches(lengths, 4, None, int) == [[3, 5, 7, 12], [40, 100]]
    assert micro_batches(lengths, 4, None, int, bucket=False) == [[5, 40, 7, 12], [100, 3]]
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
    # The step's figures are the applied update's: none of the skipped one's NaN (the row
    # goes into /v1/status, which a NaN made unreadable, and into every checkpoint).
    # (The advantages' own figures are of this test's NaN input, which no group can carry.)
    figures = {
        k: v
        for k, v in dataclasses.asdict(s).items()
        if isinstance(v, float) and not k.startswith("advantage_")
    }
    assert all(math.isfinite(v) for v in figures.values()), figures
    assert s.grad_norms == [s.grad_norm] and s.grad_norm > 0
    after = list(model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize("aggregation", ["TokenMean", "SequenceMean", "TokenSumNorm"])
@pytest.mark.parametrize(("mini_batches", "epochs", "kl"), [(1, 1, 0.0), (2, 2, 0.1)])
def test_a_masked_session_trains_nothing_and_is_in_no_normaliser(
    aggregation, mini_batches, epochs, kl
):
    # Masking a session's loss (grpo.overlong: Mask) is the step without it, its advantage
    # (from the group's baseline) kept on the others: the same update, whatever the aggregation,
    # with mini-batches, epochs (their shuffle) and the KL reference too.
    import dataclasses

    def update(gs):
        torch.manual_seed(0)
        model = tiny_llama()
        reference = tiny_llama(seed=1) if kl else None
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        cfg = LossConfig(aggregation=aggregation, kl_coef=kl)
        s = train_step(
            model,
            opt,
            gs,
            cfg,
            micro_batch_size=3,
            reference=reference,
            mini_batches=mini_batches,
            epochs=epochs,
        )
        return s, [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]

    gs = groups()
    masked = [
        dataclasses.replace(t, overlong_turns=1) if t.sample == 1 else t for t in gs[0].trajectories
    ]
    with_mask = [Group("g0", masked, gs[0].advantages, [t.sample == 1 for t in masked]), gs[1]]
    kept = [i for i, t in enumerate(masked) if t.sample != 1]
    without = [
        Group("g0", [masked[i] for i in kept], [gs[0].advantages[i] for i in kept]),
        gs[1],
    ]
    s, got = update(with_mask)
    _, expected = update(without)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert (s.overlong_sessions, s.masked_sessions, s.sessions) == (1, 1, 8)
    trained, _ = update([Group("g0", masked, gs[0].advantages), gs[1]])
    assert (trained.overlong_sessions, trained.masked_sessions) == (1, 0), "counted, trained"
    assert trained.sequences == 8
    assert s.sequences == 7 and s.tokens == 7 * 8


def test_a_step_with_every_session_masked_makes_no_update():
    gs = groups(n_groups=1, n=2)
    g = Group("g0", gs[0].trajectories, gs[0].advantages, [True, True])
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    s = train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), [g], LossConfig())
    assert (s.updates, s.sequences, s.masked_sessions, s.sessions) == (0, 0, 2, 2)
    # Their lengths are still the step's: the longest, cut off, are what a length blow-up
    # shows in first.
    assert (s.response_tokens_mean, s.response_tokens_max) == (8, 8)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def _multi_trace_groups():
    # One group: a per_request trajectory of 3 calls (advantage +1, 2-token responses) and a
    # one-call trajectory (advantage -1, 3 tokens): it has more traces and more tokens.
    def trace(n, seed):
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(1, 64, (4,), generator=g).tolist()
        return Trace(prompt, torch.randint(1, 64, (n,), generator=g).tolist(), [1] * n, [None] * n)

    many = Trajectory("a", "t", "g", 0, True, 1.0, [0], [trace(2, 1), trace(2, 2), trace(2, 3)])
    one = Trajectory("b", "t", "g", 1, True, 0.0, [0], [trace(3, 4)])
    return [Group("g", [many, one], [1.0, -1.0])]


def _frozen_step(cfg, **options):
    """One step over ``_multi_trace_groups`` that leaves the weights as they were (lr 0): the
    loss it reports is the definition's, on policy."""
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return train_step(model, optimizer, _multi_trace_groups(), cfg, micro_batch_size=1, **options)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        # On policy with unknown behaviour log-probs every token's loss is -advantage.
        ("TokenMean", (6 * -1.0 + 3 * 1.0) / 9),
        # Each trajectory's tokens averaged, then the two trajectories (counting the 4 traces
        # instead gave (3 * -1 + 1) / 4).
        ("SequenceMean", (-1.0 + 1.0) / 2),
        # Dr. GRPO: the token sum over trajectories × the constant.
        ("TokenSumNorm", (6 * -1.0 + 3 * 1.0) / (2 * 16.0)),
    ],
)
def test_each_aggregation_is_its_definition_over_trajectories(aggregation, expected):
    s = _frozen_step(LossConfig(aggregation=aggregation, sum_norm=16.0))
    assert s.loss == pytest.approx(expected, abs=1e-9)


def _gradients(aggregation, **options):
    model = tiny_llama()
    grads = {}

    class Keep(torch.optim.SGD):
        def step(self, closure=None):
            for n, p in model.named_parameters():
                grads[n] = p.grad.detach().clone()
            return super().step(closure)

    gs = groups() + _multi_trace_groups()
    cfg = LossConfig(aggregation=aggregation, sum_norm=16.0)
    train_step(model, Keep(model.parameters(), lr=0.0), gs, cfg, max_grad_norm=1e9, **options)
    return grads


@pytest.mark.parametrize("aggregation", ["TokenMean", "SequenceMean", "TokenSumNorm"])
def test_micro_batches_and_packing_change_no_gradient(aggregation):
    # One normaliser per mini-batch: a trace a pass, the whole mini-batch in one pass, and
    # passes packed by tokens give the same gradient in every mode.
    one = _gradients(aggregation, micro_batch_size=1)
    whole = _gradients(aggregation, micro_batch_size=64)
    packed = _gradients(aggregation, micro_batch_size=64, max_tokens_per_micro_batch=30)
    # Passes of two, in arrival order and bucketed by length.
    arrival = _gradients(aggregation, micro_batch_size=2, length_bucketing=False)
    bucketed = _gradients(aggregation, micro_batch_size=2)
    assert one.keys() == whole.keys() == packed.keys() == arrival.keys() == bucketed.keys()
    for name in one:
        torch.testing.assert_close(whole[name], one[name], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(packed[name], one[name], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(arrival[name], one[name], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(bucketed[name], one[name], rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in one.values())


def test_a_mini_batch_holds_whole_trajectories():
    # Two mini-batches of the 3-call trajectory and the 1-call one: each holds one trajectory
    # whole (split by trace, the 3-call one counted as a trajectory in both, SequenceMean's
    # figure was -4/9). Per mini-batch: -1 over 6 tokens, then +1 over 3.
    s = _frozen_step(LossConfig(aggregation="SequenceMean"), mini_batches=2)
    assert s.updates == 2
    assert s.loss == pytest.approx((-1.0 * 6 + 1.0 * 3) / 9, abs=1e-9)


def test_the_kl_reference_is_scored_once_a_step_not_once_an_epoch():
    model, reference = tiny_llama(), tiny_llama(seed=1)
    passes = []
    reference.get_decoder().register_forward_hook(lambda *_: passes.append(1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    cfg = LossConfig(kl_coef=0.1)
    s = train_step(model, opt, groups(), cfg, micro_batch_size=2, reference=reference, epochs=3)
    # 8 traces in micro-batches of 2: 4 reference passes, for 3 epochs of updates.
    assert s.updates == 3
    assert len(passes) == 4
    assert s.kl_mean > 0


def test_the_response_length_counts_the_sampled_tokens_not_the_tool_output_between():
    # A merged trace: two calls' answers (3 and 2 tokens) around a tool's 4-token output.
    mask = [1, 1, 1, 0, 0, 0, 0, 1, 1]
    trajs = [
        Trajectory(
            f"s{i}", "t", "g", i, True, float(i), [0], [Trace([1, 2], [5] * 9, mask, [None] * 9)]
        )
        for i in range(2)
    ]
    model = tiny_llama()
    s = train_step(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.01),
        [Group("g", trajs, [-1.0, 1.0])],
        LossConfig(),
        micro_batch_size=2,
    )
    assert (s.response_tokens_mean, s.response_tokens_max) == (5.0, 5)
