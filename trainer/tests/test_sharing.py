"""Prompt sharing: the layout (pure), and that shared rows give every trace the log-probs and
gradients it has in padded rows, on a real causal LM."""

import pytest
import torch
from tiny import tiny_llama

from floe_trainer.policy import make_batch, make_shared_batch, sharing_hidden, token_logprobs
from floe_trainer.sharing import (
    Pass,
    Row,
    choose_passes,
    common_prefix,
    layout,
    pack,
    plan_rows,
    row_cost,
    trie_batches,
)
from floe_trainer.wire import Trace

PROMPT = list(range(1, 41))


def test_common_prefix_counts_the_tokens_two_sequences_begin_with():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [6]) == 0


def test_samples_of_one_prompt_share_a_row_and_unrelated_traces_do_not():
    seqs = [PROMPT + [50, 51], PROMPT + [52, 53, 54], PROMPT + [55], [60, 61, 62]]
    rows = plan_rows(seqs, hidden=64)
    assert rows == [Row((0, 1, 2), (0, 40, 40), 40 + 2 + 3 + 1), Row((3,), (0,), 3)]


def test_a_row_is_the_prefix_tree_of_its_members():
    # In lexicographic order each member branches from the one before it where they part.
    seqs = [PROMPT + [1, 2, 3], PROMPT + [1, 2, 4], PROMPT + [1, 9]]
    (row,) = plan_rows(seqs, hidden=64)
    assert row.shared == (0, 42, 41) and row.width == 43 + 1 + 1
    # A per_request trajectory's calls: each holds the one before whole, so the row is as
    # wide as the last call alone.
    calls = [PROMPT + [50, 51], PROMPT + [50, 51, 7, 8, 52], PROMPT + [50, 51, 7, 8, 52, 9, 53]]
    (row,) = plan_rows(calls, hidden=64)
    assert row.shared == (0, 42, 45) and row.width == len(calls[-1])


def test_a_row_stops_growing_where_its_attention_would_cost_more_than_it_saves():
    # Half of each trace in common: through a narrow model (attention dominates) one row of
    # 600 costs more than two of 400; through a wide one (projections dominate) it saves.
    common = list(range(1, 201))
    seqs = [common + list(range(300, 500)), common + list(range(600, 800))]
    assert row_cost(600, 8) > 2 * row_cost(400, 8)
    assert len(plan_rows(seqs, hidden=8)) == 2
    assert layout(seqs, hidden=8) is None
    assert row_cost(600, 4096) < 2 * row_cost(400, 4096)
    assert len(plan_rows(seqs, hidden=4096)) == 1


def test_a_layout_that_saves_little_is_not_taken():
    seqs = [PROMPT + [50], PROMPT + [51]]
    assert layout(seqs, hidden=64) is not None
    # One token of ten in common: sharing it saves less than a mask is worth.
    assert layout([list(range(1, 11)), [1] + list(range(11, 20))], hidden=64) is None


def test_rows_are_packed_into_as_few_as_fit_the_widest():
    rows = [Row((0,), (0,), 10), Row((1,), (0,), 4), Row((2, 3), (0, 2), 5), Row((4,), (0,), 6)]
    packed = pack(rows)
    # Widest first, each into the first row with room: [10], [6, 4], [5].
    assert packed == [
        Row((0,), (0,), 10),
        Row((4, 1), (0, 0), 10),
        Row((2, 3), (0, 2), 5),
    ]
    # Unrelated traces of spread lengths: three padded rows' worth in place of five.
    seqs = [list(range(100, 110)), [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11], [12] * 6]
    laid = layout(seqs, hidden=64)
    assert laid is not None and len(laid) == 3 and max(r.width for r in laid) == 10
    # Traces of one length: nothing fits beside another, padded rows stay.
    assert layout([[1, 2, 3], [4, 5, 6], [7, 8, 9]], hidden=64) is None


def test_trie_batches_put_traces_that_begin_alike_in_one_pass():
    a = [PROMPT + [50 + i] for i in range(3)]
    b = [[90, 91, 92, i] for i in range(3)]
    mixed = [a[0], b[0], a[1], b[1], a[2], b[2]]
    passes = trie_batches(mixed, 3, None, lambda s: s)
    assert sorted(map(sorted, passes)) == sorted([sorted(a), sorted(b)])
    # A token budget counts what a shared layout holds: each trace beyond what it shares
    # with the one before it.
    budgeted = trie_batches(a, 8, 40 + 2, lambda s: s)
    assert [len(p) for p in budgeted] == [2, 1]


def test_choose_passes_takes_shared_rows_only_where_they_are_cheaper():
    group = [PROMPT + [50 + i, 60 + i] for i in range(4)]
    bucketed = [group[:2], group[2:]]
    trie = [group]
    chosen = choose_passes(bucketed, trie, lambda s: s, hidden=64)
    assert len(chosen) == 1 and chosen[0].rows is not None
    assert choose_passes(bucketed, trie, lambda s: s, hidden=None) == [
        Pass(group[:2]),
        Pass(group[2:]),
    ]
    distinct = [[i, i + 1, i + 2] for i in range(0, 12, 3)]
    chosen = choose_passes([distinct], [distinct], lambda s: s, hidden=64)
    assert chosen == [Pass(distinct)]


def trace(prompt, response, mask=None):
    n = len(response)
    return Trace(prompt, response, mask or [1] * n, [None] * n)


def traces_that_begin_alike():
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, 64, (20,), generator=g).tolist()
    out = []
    for n in (5, 9, 3):
        out.append(trace(prompt, torch.randint(1, 64, (n,), generator=g).tolist()))
    # A per_request trace that goes on from the first one's response (its prompt holds it).
    first = out[0]
    out.append(trace(first.prompt_token_ids + first.response_token_ids + [7, 8], [9, 10, 11]))
    # A sample whose response begins like another's: the shared part reaches into responses.
    out.append(trace(prompt, out[1].response_token_ids[:4] + [12, 13]))
    return out


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("which", ["all", "alike_responses", "calls"])
def test_shared_rows_give_every_trace_its_padded_log_probs_and_gradients(attention, which):
    model = tiny_llama(positions=128)
    model.config._attn_implementation = attention
    traces = traces_that_begin_alike()
    # All five share the prompt; the two whose responses begin alike share into them; a
    # per_request trajectory's second call holds its first whole.
    traces, common = {
        "all": (traces, 20),
        "alike_responses": ([traces[1], traces[4]], 24),
        "calls": ([traces[0], traces[3]], 25),
    }[which]
    rows = plan_rows([t.prompt_token_ids + t.response_token_ids for t in traces], hidden=4096)
    assert len(rows) == 1 and min(rows[0].shared[1:]) == common
    shared = make_shared_batch(traces, rows, attention=attention)
    assert shared.input_ids.shape == (1, rows[0].width)
    padded = make_batch(traces)
    assert shared.input_ids.numel() < padded.input_ids.numel()
    values, grads = [], []
    for batch in (padded, shared):
        model.zero_grad(set_to_none=True)
        out = token_logprobs(model, batch)
        (out * batch.loss_mask).sum().backward()
        values.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    mask = padded.loss_mask.bool()
    assert torch.equal(shared.loss_mask, padded.loss_mask)
    assert torch.allclose(values[0][mask], values[1][mask], atol=1e-5)
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-5), name


def test_two_shared_rows_of_different_widths_pad_without_touching_either():
    model = tiny_llama(positions=128).eval()
    a = traces_that_begin_alike()[:3]
    b = [trace([30, 31, 32, 33, 34, 35], [36, 37]), trace([30, 31, 32, 33, 34, 35], [38])]
    traces = a + b
    rows = plan_rows([t.prompt_token_ids + t.response_token_ids for t in traces], hidden=4096)
    assert [r.members for r in rows] == [(0, 1, 2), (3, 4)]
    with torch.no_grad():
        shared = token_logprobs(model, make_shared_batch(traces, rows))
        padded = token_logprobs(model, make_batch(traces))
    mask = make_batch(traces).loss_mask.bool()
    assert torch.isfinite(shared).all()
    assert torch.allclose(shared[mask], padded[mask], atol=1e-5)


def test_a_packed_row_keeps_its_trees_apart():
    model = tiny_llama(positions=128).eval()
    a = traces_that_begin_alike()[:2]
    b = [trace([30, 31, 32], [36, 37]), trace([40, 41], [38, 39, 42])]
    traces = a + b
    rows = [Row((0, 1, 2, 3), (0, 20, 0, 0), 25 + 9 + 5 + 5)]
    batch = make_shared_batch(traces, rows)
    # Each tree's positions start again from 0.
    assert batch.position_ids[0, 34:44].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    with torch.no_grad():
        packed = token_logprobs(model, batch)
        padded = token_logprobs(model, make_batch(traces))
    mask = make_batch(traces).loss_mask.bool()
    assert torch.allclose(packed[mask], padded[mask], atol=1e-5)


def test_models_that_cannot_take_a_custom_mask_are_never_given_shared_rows():
    model = tiny_llama()
    assert sharing_hidden(model) == 32
    model.config._attn_implementation = "flash_attention_2"
    assert sharing_hidden(model) is None
    model = tiny_llama()
    model.config.sliding_window = 16
    assert sharing_hidden(model) is None
    model = tiny_llama()
    model.config.logit_scale = 0.5
    assert sharing_hidden(model) is None


def grpo_groups(n_groups=2, n=4, prompt_len=20, response_len=8, calls=1):
    """Groups of ``n`` samples of one prompt each; with ``calls`` > 1 each sample is a
    per_request trajectory, a call's prompt the conversation so far and a tool's output."""
    from floe_trainer.batching import Group
    from floe_trainer.wire import Trajectory

    g = torch.Generator().manual_seed(5)
    out = []
    for gi in range(n_groups):
        prompt = torch.randint(1, 64, (prompt_len,), generator=g).tolist()
        trajs = []
        for s in range(n):
            traces, context = [], prompt
            for _ in range(calls):
                resp = torch.randint(1, 64, (response_len - s,), generator=g).tolist()
                traces.append(Trace(context, resp, [1] * len(resp), [-1.0] * len(resp)))
                context = context + resp + torch.randint(1, 64, (3,), generator=g).tolist()
            trajs.append(Trajectory(f"s{gi}{s}", "t", f"g{gi}", s, True, float(s % 2), [0], traces))
        out.append(Group(f"g{gi}", trajs, [1.0 if s % 2 else -1.0 for s in range(n)]))
    return out


def shared_and_padded_steps(calls=1, **kwargs):
    from floe_trainer.loss import LossConfig
    from floe_trainer.step import train_step

    results = []
    for sharing in (True, False):
        model = tiny_llama()
        # SGD: the update is the gradient's (AdamW divides a near-zero gradient by its own
        # size, which turns rounding into a whole step).
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        stats = train_step(
            model,
            opt,
            grpo_groups(calls=calls),
            LossConfig(epsilon_low=0.2, epsilon_high=0.28),
            micro_batch_size=4,
            prompt_sharing=sharing,
            **kwargs,
        )
        results.append((model, stats))
    return results


@pytest.mark.parametrize("updates", [(1, 1), (2, 2)])
@pytest.mark.parametrize("calls", [1, 3])
def test_a_step_in_shared_rows_trains_what_padded_rows_train(updates, calls):
    mini_batches, epochs = updates
    (shared, s), (padded, p) = shared_and_padded_steps(
        calls, mini_batches=mini_batches, epochs=epochs, max_tokens_per_micro_batch=200
    )
    # A group's samples share a row: the prompt (and a trajectory's earlier calls) computed
    # once, not once per trace.
    assert s.computed_tokens < p.computed_tokens
    print(
        f"computed/trace tokens: shared {s.computed_tokens}/{s.trace_tokens}, padded "
        f"{p.computed_tokens}/{p.trace_tokens}"
    )
    assert s.trace_tokens == p.trace_tokens and s.computed_tokens < s.trace_tokens
    assert shared.floe_shared_rows_verified is True
    assert s.updates == p.updates == mini_batches * epochs
    assert s.loss == pytest.approx(p.loss, abs=1e-6)
    assert s.clip_fraction == pytest.approx(p.clip_fraction)
    assert s.entropy == pytest.approx(p.entropy, abs=1e-5)
    for (name, a), b in zip(shared.named_parameters(), padded.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5), name


def test_a_model_that_gives_other_log_probs_in_shared_rows_is_never_given_them(monkeypatch, caplog):
    import floe_trainer.step as step

    def mask_ignored(traces, rows, pad_id=0, temperature=1.0, attention="sdpa"):
        # What a model whose attention ignores the custom mask computes: every member's
        # tokens see the members before it.
        batch = make_shared_batch(traces, rows, pad_id, temperature, attention)
        width = batch.input_ids.shape[1]
        batch.attention_mask[:] = torch.ones(width, width, dtype=torch.bool).tril()
        return batch

    monkeypatch.setattr(step, "make_shared_batch", mask_ignored)
    (model, s), (_, p) = shared_and_padded_steps()
    assert model.floe_shared_rows_verified is False
    assert "prompt sharing off for this model" in caplog.text
    assert s.computed_tokens == p.computed_tokens
    assert s.loss == pytest.approx(p.loss, abs=1e-6)


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "tiny-qwen3"])
def test_real_models_give_shared_rows_their_padded_log_probs(name):
    """SmolLM2 (Llama) and Qwen3 (queries and keys normed per head) as the trainer loads them:
    their attention takes the shared rows' mask."""
    import os
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    models = os.environ.get("FLOE_TEST_MODELS")
    assert models, "FLOE_TEST_MODELS must name the converted models (scripts/vllm-cpu/setup.sh)"
    model = AutoModelForCausalLM.from_pretrained(Path(models) / name, dtype=torch.float32).eval()
    hidden = sharing_hidden(model)
    assert hidden == model.config.hidden_size
    g = torch.Generator().manual_seed(11)
    vocab = model.config.vocab_size

    def tokens(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    prompt = tokens(300)
    traces = [trace(prompt, tokens(n)) for n in (40, 17, 60, 33)]
    first = traces[0]
    traces.append(trace(first.prompt_token_ids + first.response_token_ids + tokens(5), tokens(9)))
    rows = layout([t.prompt_token_ids + t.response_token_ids for t in traces], hidden)
    assert rows is not None and len(rows) == 1 and min(rows[0].shared[1:]) == 300
    with torch.no_grad():
        shared = token_logprobs(model, make_shared_batch(traces, rows))
        padded = token_logprobs(model, make_batch(traces))
    mask = make_batch(traces).loss_mask.bool()
    assert (shared - padded).abs()[mask].max() < 1e-4


def test_common_prefix_is_exact_across_its_blocks():
    a = list(range(1000))
    for cut in (0, 1, 255, 256, 257, 511, 512, 999):
        b = a[:cut] + [-1] + a[cut + 1 :]
        assert common_prefix(a, b) == cut
    assert common_prefix(a, a) == 1000 and common_prefix(a, a[:300]) == 300
