"""LoRA (``floe_trainer.lora``) on CPU: only the adapter trains (with gradient checkpointing
too), the merged weights are the adapter folded in, the job's settings are read and refused
where they cannot work, and a target the model lacks is refused before it loads."""

from pathlib import Path

import pytest
import torch
from tiny import tiny_llama

from floe_trainer import lora
from floe_trainer.bench_step import synthetic_groups
from floe_trainer.loss import LossConfig
from floe_trainer.memory_plan import LORA_TARGETS, LoraTargetError, ModelShape, review
from floe_trainer.step import train_step
from floe_trainer.trainer import TrainerConfig


def test_the_job_settings_are_read_with_their_defaults():
    spec = lora.LoraSpec.from_operator({"rank": 8})
    assert spec == lora.LoraSpec(8, 16.0, LORA_TARGETS, True)
    spec = lora.LoraSpec.from_operator(
        {"rank": 4, "alpha": 4, "targetModules": ["q_proj"], "mergeFinal": False}
    )
    assert spec == lora.LoraSpec(4, 4.0, ("q_proj",), False)
    assert lora.LoraSpec.from_operator(None) is None
    with pytest.raises(ValueError, match="rank must be 1 to 512"):
        lora.LoraSpec.from_operator({"rank": 1024})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"grpo": {"weightSync": "NCCL"}, "gpus": 1}, "pushes the adapter as a file"),
        ({"grpo": {"weightSync": "NCCL"}, "gpus": 2}, "pushes the adapter as a file"),
    ],
)
def test_lora_is_refused_where_it_cannot_work(tmp_path, extra, message):
    conf = {"model": "m", "numSamples": 4, "lora": {"rank": 8}, **extra}
    with pytest.raises(ValueError, match=message):
        TrainerConfig.from_operator(conf, tmp_path)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_step_trains_the_adapter_and_nothing_else(checkpointing):
    model = lora.wrap(tiny_llama(seed=1), lora.LoraSpec(4, 8.0))
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
        model.enable_input_require_grads()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(lora.trainable(model), lr=1e-2)
    groups = synthetic_groups(2, 4, 6, 6, vocab=64)
    stats = train_step(model, optimizer, groups, LossConfig(), micro_batch_size=2)
    assert stats.tokens > 0
    after = model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    # B starts at 0 (the policy starts as the base) and both A and B train; the base never.
    assert moved and all("lora_" in k for k in moved)
    assert any("lora_A" in k for k in moved) and any("lora_B" in k for k in moved)
    targeted = {k.split(".")[-4] for k in moved}
    assert targeted == set(LORA_TARGETS)


def test_the_merged_weights_are_the_adapter_folded_into_the_base():
    model = lora.wrap(tiny_llama(seed=2), lora.LoraSpec(4, 8.0))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    merged, rounding = lora.merged_weights(model.state_dict(), lora.LoraSpec(4, 8.0))
    expected = model.merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    for k, v in expected.items():
        torch.testing.assert_close(merged[k], v, rtol=0, atol=1e-6)
    assert rounding < 1e-5, "fp32 keeps the adapter's change"


def test_a_merge_into_16_bit_weights_says_how_much_of_a_small_update_it_lost():
    # An RL-sized update (1e-5 a weight) in bf16, whose step near 0.02 is 1.2e-4: mostly lost.
    model = lora.wrap(tiny_llama(seed=2), lora.LoraSpec(4, 8.0)).to(torch.bfloat16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for k, v in state.items():
        if "lora_A" in k:
            state[k] = torch.full_like(v, 1e-2)
        elif "lora_B" in k:
            state[k] = torch.full_like(v, 1e-4 / 4)
    _, small = lora.merged_weights(state, lora.LoraSpec(4, 8.0))
    assert small > 0.5
    # A large one survives the rounding.
    for k, v in state.items():
        if "lora_B" in k:
            state[k] = torch.full_like(v, 1.0)
    _, large = lora.merged_weights(state, lora.LoraSpec(4, 8.0))
    assert large < 0.05


def test_a_fresh_adapter_is_the_same_on_every_process_and_leaves_the_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    base = tiny_llama(seed=2)
    torch.manual_seed(123)
    first = lora.wrap(base, lora.LoraSpec(4, 8.0)).state_dict()
    assert torch.equal(torch.rand(1), expected_next), "the caller's random stream is untouched"
    again = lora.wrap(tiny_llama(seed=2), lora.LoraSpec(4, 8.0)).state_dict()
    for k, v in first.items():
        assert torch.equal(v, again[k]), k


def test_the_adapter_size_comes_from_the_weights_headers(tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    shape = ModelShape.from_dir(Path(tmp_path))
    model = lora.wrap(tiny_llama(), lora.LoraSpec(4, 8.0))
    assert shape.adapter_parameters(4, LORA_TARGETS) == sum(
        p.numel() for p in lora.trainable(model)
    )
    assert shape.missing_modules(("q_proj", "c_attn")) == ["c_attn"]
    # Neither the embeddings nor the head take an adapter the merge knows.
    assert shape.missing_modules(("embed_tokens", "lm_head")) == ["embed_tokens", "lm_head"]


def test_a_target_module_the_model_lacks_is_refused_before_it_loads(tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    with pytest.raises(LoraTargetError, match=r"c_attn not in .*its linear modules: .*q_proj"):
        review(tmp_path, "cpu", "fp32", 64, 1, False, False, lora=(8, ("q_proj", "c_attn")))


def test_the_kl_reference_of_a_lora_policy_is_its_base_with_the_adapter_off():
    """No second model for the KL term: the policy with its adapter off is the base it started
    from. Its log-probs equal a separate copy's, and a step pulled towards it equals the same
    step with that copy as the reference."""
    from floe_trainer.policy import make_batch, token_logprobs
    from floe_trainer.step import reference_logprobs

    def adapted():
        model = lora.wrap(tiny_llama(seed=3), lora.LoraSpec(4, 8.0))
        torch.manual_seed(7)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)  # the policy has moved off its base
        return model

    base = tiny_llama(seed=3).eval()
    model = adapted()
    groups = synthetic_groups(2, 4, 6, 6, vocab=64)
    batch = make_batch([t for g in groups for tr in g.trajectories for t in tr.traces])
    with torch.no_grad():
        off = reference_logprobs(model, None, batch)
        separate = token_logprobs(base, batch)
        on = token_logprobs(model, batch)
    torch.testing.assert_close(off, separate, rtol=0, atol=1e-6)
    assert (on - separate).abs().max() > 1e-3, "the adapter is on outside the reference"
    cfg = LossConfig(kl_coef=0.5)
    stepped = []
    for reference in (None, base):
        m = adapted()
        optimizer = torch.optim.AdamW(lora.trainable(m), lr=1e-2)
        stats = train_step(m, optimizer, groups, cfg, micro_batch_size=2, reference=reference)
        assert stats.kl_mean > 0
        stepped.append((stats.kl_mean, m.state_dict()))
    (kl_off, off_state), (kl_copy, copy_state) = stepped
    assert kl_off == pytest.approx(kl_copy, rel=1e-6)
    for k, v in copy_state.items():
        torch.testing.assert_close(off_state[k], v, rtol=0, atol=1e-6)
