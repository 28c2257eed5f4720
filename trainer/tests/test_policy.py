import math

import torch

from floe_trainer.policy import make_batch
from floe_trainer.wire import Trace


def trace(prompt, response, mask, logprobs):
    return Trace(
        prompt_token_ids=prompt, response_token_ids=response, loss_mask=mask, logprobs=logprobs
    )


def test_make_batch_pads_and_indexes_the_response_tokens():
    b = make_batch(
        [
            trace([5, 6, 7], [8, 9], [1, 0], [-0.5, None]),
            trace([1], [2, 3, 4], [1, 1, 1], [-1.0, -2.0, -3.0]),
            trace([1, 2], [], [], []),
        ],
        pad_id=99,
    )
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 4, 99], [1, 2, 99, 99, 99]]
    assert b.attention_mask.tolist() == [[1] * 5, [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    # The logits row predicting response token j is prompt_len - 1 + j.
    assert b.positions.tolist() == [[2, 3, 0], [0, 1, 2], [0, 0, 0]]
    assert b.response_ids.tolist() == [[8, 9, 0], [2, 3, 4], [0, 0, 0]]
    assert b.loss_mask.tolist() == [[1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert b.behaviour.dtype == torch.float64
    assert b.behaviour.tolist() == [[-0.5, 0, 0], [-1, -2, -3], [0, 0, 0]]
    assert b.behaviour_known.tolist() == [[True, False, False], [True] * 3, [False] * 3]
    # Row 2 (prompt of 1) is the first to need logits: from position 0.
    assert b.first_position == 0
    assert make_batch([trace([5, 6, 7], [8], [1], [None])]).first_position == 2


def test_padded_batch_logprobs_equal_each_trace_alone_and_the_masked_full_forward():
    from tiny import tiny_llama

    from floe_trainer.policy import token_logprobs

    model = tiny_llama(positions=64).eval()
    traces = [
        trace([1, 2, 3, 4, 5], [6, 7], [1, 1], [None, None]),
        trace([9], [10, 11, 12, 13], [0, 1, 1, 1], [None] * 4),
        trace([20, 21, 22], [23], [1], [None]),
    ]
    with torch.no_grad():
        together = token_logprobs(model, make_batch(traces))
        for i, t in enumerate(traces):
            n = len(t.response_token_ids)
            alone = token_logprobs(model, make_batch([t]))[0, :n]
            assert torch.allclose(together[i, :n], alone, atol=1e-5)
            # What the old full forward with an attention mask gave.
            b = make_batch([t])
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[0]
            full = logits.log_softmax(-1)[b.positions[0, :n], b.response_ids[0, :n]]
            assert torch.allclose(alone.float(), full, atol=1e-5)


def test_logprobs_in_chunks_equal_the_whole_forward_in_value_and_gradient():
    from tiny import tiny_llama

    from floe_trainer.policy import _chunkable, _logprobs_whole, token_logprobs

    model = tiny_llama(positions=64)
    assert _chunkable(model)
    b = make_batch(
        [
            trace([1, 2, 3], [4, 5, 6, 7, 8], [1] * 5, [None] * 5),
            trace([9, 10, 11, 12, 13, 14], [15, 16], [1, 1], [None] * 2),
            trace([], [17, 18], [1, 1], [None] * 2),
        ]
    )
    grads = []
    values = []
    for run in (lambda: _logprobs_whole(model, b)[0], lambda: token_logprobs(model, b, chunk=2)):
        model.zero_grad(set_to_none=True)
        out = run()
        (out * b.loss_mask).sum().backward()
        values.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    masked = b.loss_mask.bool()
    assert torch.allclose(values[0][masked], values[1][masked], atol=1e-6)
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-6), name


def test_a_model_whose_logits_are_transformed_takes_the_whole_forward():
    from tiny import tiny_llama

    from floe_trainer.policy import _chunkable

    model = tiny_llama()
    model.config.logit_scale = 0.5
    assert not _chunkable(model)
    # Falcon-H1's multiplier and Inkling's muP divisor were not on the list (the chunked path
    # took the log-softmax of other logits than the model's); neither was a composite
    # model's text config. An identity (1.0) is no transform.
    for key in ("lm_head_multiplier", "logits_mup_width_multiplier"):
        model = tiny_llama()
        setattr(model.config, key, 0.25)
        assert not _chunkable(model), key
        setattr(model.config, key, 1.0)
        assert _chunkable(model), key
    model = tiny_llama()
    text = type(model.config)(**model.config.to_dict())
    text.final_logit_softcapping = 30.0
    model.config.get_text_config = lambda *a, **k: text
    assert not _chunkable(model)


def test_logprobs_are_of_the_tempered_distribution_the_tokens_were_sampled_from():
    from tiny import tiny_llama

    from floe_trainer.policy import _logprobs_whole, token_logprobs

    model = tiny_llama(positions=64).eval()
    t = trace([1, 2, 3, 4], [5, 6, 7], [1, 1, 1], [None] * 3)
    with torch.no_grad():
        plain = token_logprobs(model, make_batch([t]))[0]
        b = make_batch([t], temperature=0.5)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[0]
        tempered = (logits / 0.5).log_softmax(-1)[b.positions[0], b.response_ids[0]]
        for out in (token_logprobs(model, b, chunk=2)[0], _logprobs_whole(model, b)[0][0]):
            assert torch.allclose(out.float(), tempered, atol=1e-5)
            # Not the untempered policy's: a trainer that ignored the temperature would
            # weigh the tokens by a distribution they were not drawn from.
            assert (out - plain).abs().max() > 1e-2


def test_entropy_is_the_tempered_policys_at_each_response_position_on_every_path():
    from tiny import tiny_llama

    from floe_trainer.policy import _logprobs_whole, token_logprobs, token_logprobs_and_entropy

    model = tiny_llama(positions=64)
    t = trace([1, 2, 3, 4], [5, 6, 7], [1, 1, 1], [None] * 3)
    b = make_batch([t], temperature=0.7)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[0]
        p = (logits[b.positions[0]] / 0.7).softmax(-1)
        expected = -(p * p.log()).sum(-1)
    # The chunked path with grad (checkpointed chunks), without, and the whole forward.
    logp, entropy = token_logprobs_and_entropy(model, b, chunk=2)
    assert logp.requires_grad and not entropy.requires_grad
    assert torch.allclose(entropy[0], expected, atol=1e-5)
    assert torch.allclose(logp.detach(), token_logprobs(model, b, chunk=2).detach())
    (logp * b.loss_mask).sum().backward()  # the entropy takes no part in the gradient
    with torch.no_grad():
        _, entropy = token_logprobs_and_entropy(model, b)
        assert torch.allclose(entropy[0], expected, atol=1e-5)
        _, whole = _logprobs_whole(model, b, entropy=True)
        assert torch.allclose(whole[0], expected, atol=1e-5)
    # Bounds: 0 for a certain policy, log(V) for a uniform one.
    vocab = logits.shape[-1]
    assert float(expected.max()) <= math.log(vocab) + 1e-5 and float(expected.min()) > 0


def test_dropout_is_off_in_training_passes_and_the_config_keeps_it():
    from tiny import tiny_llama

    from floe_trainer.policy import without_dropout

    model = tiny_llama(attention_dropout=0.5).train()
    ids = torch.randint(1, 64, (1, 12))
    assert not torch.equal(model(ids).logits, model(ids).logits), "dropout draws each pass"
    changed = without_dropout(model)
    assert len(changed) == 2, changed  # each layer's attention_dropout
    assert torch.equal(model(ids).logits, model(ids).logits)
    assert torch.allclose(model(ids).logits, model.eval()(ids).logits, atol=1e-6)
    assert model.config.attention_dropout == 0.5, "what checkpoints save is the model's own"
    drop = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
    assert without_dropout(drop) == ["1"] and drop[1].p == 0.0


def test_a_training_pass_of_a_mixture_of_experts_model_samples_no_router_noise():
    """Mixtral's router jitter and PhiMoE's sparsemixer (Gumbel sampling of the experts) run in
    training mode: a step trained a noisily routed model vLLM never sampled, the first update's
    ratio off 1. Only the modules that checkpoint stay in training mode."""
    from tiny import TINY_SHAPE
    from transformers import MixtralConfig, MixtralForCausalLM, PhimoeConfig, PhimoeForCausalLM

    from floe_trainer.policy import token_logprobs, train_deterministically, without_dropout

    small = dict(
        **TINY_SHAPE, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64
    )
    batch = make_batch([trace(list(range(1, 9)), [9, 10, 11], [1, 1, 1], [None] * 3)])
    for model in (
        MixtralForCausalLM(MixtralConfig(router_jitter_noise=0.5, **small)),
        PhimoeForCausalLM(PhimoeConfig(router_jitter_noise=0.5, input_jitter_noise=0.5, **small)),
    ):
        torch.manual_seed(0)
        without_dropout(model)
        served = token_logprobs(model.eval(), batch)
        noisy = token_logprobs(model.train(), batch)
        assert not torch.allclose(noisy, served, atol=1e-6), "training mode draws noise"
        trained = token_logprobs(train_deterministically(model), batch)
        assert torch.allclose(trained, served, atol=1e-6), type(model).__name__
        layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        assert layers and all(m.training for m in layers), "they checkpoint only in training"
