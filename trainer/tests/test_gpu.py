"""The trainer's GPU path on a real model: bf16 autocast, gradient checkpointing and the KL
reference on CUDA. Skipped without a GPU (CI has none); run on a lent GPU by
``scripts/trainer/gpu-proof.sh``, with ``FLOE_TEST_MODELS`` holding ``smollm2-135m-instruct``."""

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from floe_trainer.bench_step import synthetic_groups
from floe_trainer.loss import LossConfig
from floe_trainer.placement import resolve
from floe_trainer.policy import make_batch, token_logprobs
from floe_trainer.step import train_step
from floe_trainer.wire import Trace

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    d = Path(os.environ.get("FLOE_TEST_MODELS", "/nonexistent")) / "smollm2-135m-instruct"
    if not (d / "model.safetensors").exists():
        pytest.skip(f"no converted SmolLM2 at {d}")
    return d


def load(d: Path, device: str, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(device)


def test_bf16_logprobs_on_the_gpu_track_fp32_on_cpu(model_dir):
    # Real text, so the logprobs are in the model's normal range (not uniform noise).
    tok = AutoTokenizer.from_pretrained(model_dir)
    pairs = [
        ("The capital of France is", " Paris, a city on the Seine known for its museums."),
        ("def add(a, b):", "\n    return a + b\n\nprint(add(2, 3))"),
    ]
    traces = []
    for prompt, answer in pairs:
        p, r = tok(prompt)["input_ids"], tok(answer)["input_ids"]
        traces.append(Trace(p, r, [1] * len(r), [None] * len(r)))
    batch = make_batch(traces)
    with torch.no_grad():
        cpu = token_logprobs(load(model_dir, "cpu"), batch)
        gpu_p = resolve("cuda", "bf16")
        with gpu_p.autocast():
            gpu = token_logprobs(load(model_dir, "cuda"), batch.to(gpu_p.device)).cpu()
    diff = (cpu - gpu).abs()
    print(f"bf16 GPU vs fp32 CPU logprobs: mean |diff| {diff.mean():.4f}, max {diff.max():.4f}")
    assert diff.mean() < 0.05
    assert torch.isfinite(gpu).all()


def test_a_bf16_step_with_checkpointing_and_kl_trains_fp32_master_weights(model_dir):
    p = resolve("cuda", "auto")
    assert p.precision == "bf16"
    model = load(model_dir, "cuda")
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    reference = load(model_dir, "cuda", torch.bfloat16).eval().requires_grad_(False)
    before = model.lm_head.weight.detach().clone()
    opt = p.optimizer(model.parameters(), 1e-5)
    groups = synthetic_groups(2, 4, 32, 32, vocab=2000)
    cfg = LossConfig(kl_coef=0.1)
    first = train_step(model, opt, groups, cfg, 4, placement=p, reference=reference)
    second = train_step(model, opt, groups, cfg, 4, placement=p, reference=reference)
    # Step 1: the policy is the reference (up to the reference's bf16 weights).
    assert first.kl_mean < 1e-2
    # Step 2: the policy moved away from the reference, and the KL term sees it.
    assert second.kl_mean > first.kl_mean
    assert model.lm_head.weight.dtype == torch.float32
    assert not torch.equal(model.lm_head.weight, before)
    assert all(torch.isfinite(torch.tensor([s.loss, s.grad_norm])).all() for s in (first, second))


def test_the_gpu_utilization_series_is_exported_per_gpu():
    """What FloeTrainerGPUIdle and the dashboard's GPU panel read: one series per visible GPU,
    from NVML (the trainer image installs nvidia-ml-py)."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (the trainer image has it)")
    from floe_trainer.metrics import Metrics

    page = Metrics().render().decode()
    for i in range(torch.cuda.device_count()):
        assert f'floe_trainer_gpu_utilization{{gpu="{i}"}}' in page, page
