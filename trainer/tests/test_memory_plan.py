"""The memory plan: its arithmetic, its refusals, the repository's train example against the GPU
it names, and its estimate against measured peak memory of real training steps on CPU."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from floe_trainer.memory_plan import (
    CUDA_RUNTIME,
    GIB,
    LORA_TARGETS,
    MemoryPlanError,
    ModelShape,
    Settings,
    check,
    estimate,
)

ROOT = Path(__file__).resolve().parents[2]

# Qwen3's published configs (the example's model, and the 8B it used before).
QWEN3_1_7B = {
    "model_type": "qwen3",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
}
QWEN3_8B = {
    **QWEN3_1_7B,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "tie_word_embeddings": False,
}
# What torch reports as an H100 80GB's total memory.
H100 = int(79.1 * GIB)


def saved_tiny(tmp_path, tied=False):
    from tiny import tiny_llama

    model = tiny_llama()
    model.config.tie_word_embeddings = tied
    if tied:
        model.tie_weights()
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_the_shape_counts_parameters_from_the_weights_headers_and_from_the_config(tmp_path, tied):
    model = saved_tiny(tmp_path, tied)
    shape = ModelShape.from_dir(tmp_path)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    config = json.loads((tmp_path / "config.json").read_text())
    assert ModelShape.from_config(config).parameters == shape.parameters
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert shape.largest_unit == max(per_layer, 64 * 32)
    assert (shape.layers, shape.hidden, shape.intermediate, shape.vocab) == (2, 32, 64, 64)


def test_queries_and_keys_normed_per_head_are_found_from_the_weights_or_the_architecture(
    tmp_path,
):
    # Qwen3 (q_norm / k_norm): the query and key widths, 16 × 128 + 8 × 128.
    assert ModelShape.from_config(QWEN3_1_7B).qk_norm_width == 3072
    llama = {**QWEN3_1_7B, "model_type": "llama"}
    assert ModelShape.from_config(llama).qk_norm_width == 0
    # From the weights' names when the headers are there, whatever the architecture says.
    norms = {"model.layers.0.self_attn.q_norm.weight": (128,)}
    assert ModelShape.from_config(llama, norms).qk_norm_width == 3072
    saved_tiny(tmp_path)
    assert ModelShape.from_dir(tmp_path).qk_norm_width == 0


def test_the_estimate_adds_up_term_by_term():
    shape = ModelShape(
        parameters=1000,
        layers=2,
        hidden=8,
        intermediate=16,
        vocab=100,
        max_positions=64,
        heads=2,
        largest_unit=400,
    )
    s = Settings("cuda", "bf16", sequence=10, micro_batch=2, reference=True, logits_chunk=4)
    items = dict(estimate(shape, s).items)
    assert items["weights"] == 4000 and items["gradients"] == 4000
    assert items["AdamW state"] == 8000
    assert items["bf16 weight copies"] == 2000
    assert items["reference model"] == 2000
    # 20 tokens × 2 layers × ((10·8 + 4·16) values × 2 bytes + 4·8 fp32 upcasts × 4 bytes).
    assert items["activations"] == 20 * 2 * (144 * 2 + 128)
    # Queries and keys normed per head (Qwen3): their fp32 upcast and bf16 output, 6 bytes
    # a value of their width on top; fp32, 8.
    qk = replace(shape, qk_norm_width=12)
    assert dict(estimate(qk, s).items)["activations"] == 20 * 2 * (144 * 2 + 128 + 12 * 6)
    qk32 = dict(estimate(qk, replace(s, precision="fp32")).items)["activations"]
    assert qk32 == 20 * 2 * (144 * 4 + 12 * 8)
    # 2 sequences × a chunk of 4 positions × vocab × (4 fp32 copies + the bf16 head output).
    assert items["logits"] == 8 * 100 * (16 + 2)
    # Two traces a micro-batch: their padding mask, one byte a position pair.
    assert items["attention"] == 2 * 10 * 10
    assert items["runtime"] == CUDA_RUNTIME
    ckpt = dict(
        estimate(shape, Settings("cpu", "fp32", 10, gradient_checkpointing=True, runtime=7)).items
    )
    assert ckpt["activations"] == 10 * (2 * 8 * 4 + 144 * 4)
    # CPU attention: one fp32 [heads, T, T] score tensor; the runtime as measured.
    assert ckpt["attention"] == 2 * 10 * 10 * 4
    assert ckpt["runtime"] == 7
    # A GPU in fp32: each layer's fp32 probabilities kept (one layer's with checkpointing),
    # two more live in the layer running.
    gpu32 = dict(estimate(shape, Settings("cuda", "fp32", 10)).items)
    assert gpu32["attention"] == 10 * 10 * 2 * 4 * (2 + 2)
    gpu32_ckpt = estimate(shape, Settings("cuda", "fp32", 10, gradient_checkpointing=True))
    assert dict(gpu32_ckpt.items)["attention"] == 10 * 10 * 2 * 4 * (1 + 2)
    sharded = dict(estimate(shape, Settings("cuda", "bf16", 10, shards=4, reference=True)).items)
    assert sharded["weights"] == 1000 and sharded["AdamW state"] == 2000
    # Two units gathered in fp32, with their bf16 casts; the reference whole.
    assert sharded["gathered layers"] == 2 * 400 * (4 + 2)
    assert sharded["reference model"] == 2000
    assert sharded["logits"] == 10 * 100 * (16 + 2)
    # Sharded or not, the logits are a chunk's worth (4 positions here), not every position's.
    s = Settings("cuda", "bf16", 10, logits_chunk=4)
    for shards in (1, 4):
        chunked = dict(estimate(shape, replace(s, shards=shards)).items)
        assert chunked["logits"] == 4 * 100 * (16 + 2)


def test_a_step_that_cannot_fit_names_the_first_change_that_fits():
    shape = ModelShape.from_config(QWEN3_1_7B)
    s = Settings("cuda", "bf16", sequence=16384, micro_batch=1)
    with pytest.raises(MemoryPlanError) as e:
        check(shape, s, H100, "GPU")
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("memory plan: a training step needs ")
    assert "on each GPU, which has 79.1 GiB" in line
    assert line.endswith("GiB)") and ": set grpo.gradientCheckpointing: true (" in line
    # With eight traces a pass, checkpointing alone is not enough: a pass of one context's
    # tokens is (short traces still packed together).
    with pytest.raises(MemoryPlanError, match="set grpo.maxTokensPerMicroBatch: 16384 \\("):
        check(
            shape,
            Settings("cuda", "bf16", 16384, micro_batch=8, gradient_checkpointing=True),
            H100,
            "GPU",
        )


def test_a_token_budget_bounds_the_pass_but_never_below_one_whole_trace():
    shape = ModelShape.from_config(QWEN3_1_7B)
    whole = Settings("cuda", "bf16", 16384, micro_batch=8)
    assert whole.tokens == 8 * 16384
    budget = Settings("cuda", "bf16", 16384, micro_batch=8, max_tokens=32768)
    assert budget.tokens == 32768
    assert Settings("cuda", "bf16", 16384, micro_batch=8, max_tokens=1000).tokens == 16384
    a, b = dict(estimate(shape, whole).items), dict(estimate(shape, budget).items)
    assert b["activations"] * 4 == a["activations"]
    # A pass of several traces carries their padding mask: tokens × context bytes.
    assert b["attention"] == 32768 * 16384
    assert estimate(shape, budget).as_json()["tokensPerMicroBatch"] == 32768


def test_a_model_too_big_to_train_whole_is_pointed_to_a_lora_adapter():
    shape = ModelShape.from_config(QWEN3_8B)
    s = Settings("cuda", "bf16", 16384, gradient_checkpointing=True)
    with pytest.raises(MemoryPlanError, match=r"set train.lora.rank: 16 \(a LoRA adapter\)"):
        check(shape, s, H100, "GPU")
    # Rank 16 on every projection of 36 layers: 16 × (in + out) each.
    per_layer = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 12288))
    assert shape.adapter_parameters(16, LORA_TARGETS) == 36 * per_layer
    lora = dict(estimate(shape, replace(s, adapter=36 * per_layer)).items)
    # The frozen base in bf16; only the adapter has fp32 weights, gradients and AdamW state.
    assert lora["weights"] == 2 * shape.parameters + 4 * 36 * per_layer
    assert lora["gradients"] == 4 * 36 * per_layer and lora["AdamW state"] == 8 * 36 * per_layer
    assert lora["bf16 weight copies"] == 0
    # The KL reference is the base with the adapter off: no second copy to plan.
    with_kl = dict(estimate(shape, replace(s, adapter=36 * per_layer, reference=True)).items)
    assert with_kl["reference model"] == 0
    assert dict(estimate(shape, replace(s, reference=True)).items)["reference model"] > 0
    # Over 8 processes the base and the adapter are divided; two units gathered in bf16.
    sharded = dict(estimate(shape, replace(s, adapter=36 * per_layer, shards=8)).items)
    assert sharded["weights"] == (2 * shape.parameters + 4 * 36 * per_layer) // 8
    assert sharded["AdamW state"] == 8 * (36 * per_layer // 8)
    assert sharded["gathered layers"] == 2 * shape.largest_unit * 2


def test_a_model_too_big_for_the_device_is_refused_whatever_the_settings():
    shape = ModelShape.from_config(QWEN3_8B)
    s = Settings("cuda", "bf16", 16384, gradient_checkpointing=True)
    even = "no setting makes it fit \\(even with a LoRA adapter, .* alone are 15.9"
    with pytest.raises(MemoryPlanError, match=even):
        check(shape, s, 12 * GIB, "GPU")


def test_the_train_example_fits_the_gpu_it_names():
    job = yaml.safe_load((ROOT / "examples/rolloutjob-train.yaml").read_text())
    train = job["spec"]["train"]
    assert train["model"].endswith("Qwen3-1.7B")
    grpo = train.get("grpo", {})
    args = train.get("vllm", {}).get("args", [])
    sequence = int(args[args.index("--max-model-len") + 1])
    s = Settings(
        "cuda",
        "bf16",
        sequence,
        micro_batch=grpo.get("microBatchSize", 4),
        max_tokens=grpo.get("maxTokensPerMicroBatch"),
        gradient_checkpointing=grpo.get("gradientCheckpointing", False),
        reference=grpo.get("klCoef", 0) > 0,
    )
    plan = check(ModelShape.from_config(QWEN3_1_7B), s, H100, "GPU")
    assert plan.total < 0.9 * H100
    assert round(plan.total / GIB, 1) == 48.6  # the figure the example's header gives


def test_serve_refuses_a_step_that_cannot_fit_before_loading_the_model(tmp_path):
    saved_tiny(tmp_path / "model")
    conf = {
        "model": str(tmp_path / "model"),
        "numSamples": 2,
        "gpus": 0,
        # A trillion-token context: no machine holds its activations.
        "maxSequenceTokens": 10**12,
        "ingestListen": "127.0.0.1:0",
    }
    env = {**os.environ, "FLOE_TRAINER_CONFIG": json.dumps(conf)}
    state = tmp_path / "state"
    for command in (["serve", "--state-dir", str(state)], ["plan"]):
        done = subprocess.run(
            [sys.executable, "-m", "floe_trainer.cli", *command],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 3, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("memory plan: a training step needs "), last
        assert "shorten the context" in last or "no setting makes it fit" in last
    # Nothing was loaded or written: the weights directory comes after the model.
    assert not (state / "weights").exists()
    conf["maxSequenceTokens"] = 64
    done = subprocess.run(
        [sys.executable, "-m", "floe_trainer.cli", "plan"],
        env={**os.environ, "FLOE_TRAINER_CONFIG": json.dumps(conf)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    assert planned["tokensPerMicroBatch"] == 4 * 64
    assert 0 < planned["totalBytes"] < planned["capacityBytes"]


def probe(model: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "floe_trainer.memory_probe", "--model-dir", str(model), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("args", "lowest"),
    [
        # Logits in two chunks; activations the largest variable term. The estimate undershoots
        # this one the most: 0.868 of the peak (session 33). It was 0.80-0.84 until the step
        # stopped keeping a micro-batch's log-probs and loss (its autograd graph) through the
        # next one's forward: 0.44 GiB of the ~1.5 GiB gap. The rest is glibc's heap: a
        # 1,536-token hidden state (3.4 MiB) sits under the trainer's 4 MiB mmap threshold, and
        # the first micro-batch's freed ones fragment it (at 128 KiB the peak is the estimate).
        (["--sequence", "1536"], 0.8),
        # Checkpointed layers: the fp32 state and the logits' chunk dominate.
        pytest.param(
            ["--sequence", "2560", "--gradient-checkpointing"],
            0.8,
            marks=pytest.mark.full(
                reason="the slowest probe on CPU (130 s on a slow 2-core machine); "
                "scripts/trainer/gpu-scale-proof.sh measures checkpointed steps on a GPU"
            ),
        ),
        # A LoRA adapter: the frozen base, the adapter's state, the same activations.
        pytest.param(
            ["--sequence", "2560", "--lora-rank", "16"],
            0.8,
            marks=pytest.mark.full(
                reason="the slowest test of the suite on CPU (282 s on a slow 2-core machine, "
                "its largest cost); the adapter's terms are checked in "
                "test_a_model_too_big_to_train_whole_is_pointed_to_a_lora_adapter and the "
                "activations they share against a measured peak by the full probe"
            ),
        ),
    ],
    ids=["full", "gradient-checkpointing", "lora"],
)
def test_the_estimate_is_within_a_fifth_of_the_measured_peak_on_cpu(args, lowest):
    models = os.environ.get("FLOE_TEST_MODELS")
    assert models, "FLOE_TEST_MODELS must name the converted models (scripts/vllm-cpu/setup.sh)"
    got = probe(Path(models) / "smollm2-135m-instruct", *args)
    ratio = got["estimateOverPeak"]
    print(json.dumps(got))
    assert lowest <= ratio <= 1.2, got
    assert got["peakBytes"] > 3 * GIB  # a real step of a 163M-parameter model ran


# The small random layer whose saved bytes are counted, and whose plan they are checked against.
SIZES = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
}


def saved_bytes_per_token_and_layer(architecture: str, precision: str, tokens: int = 256) -> float:
    """What autograd keeps for the backward pass, per token and decoder layer: the forward of a
    2- and a 4-layer random model, the difference over the two layers between them."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    config = {"llama": LlamaConfig, "qwen3": Qwen3Config}[architecture]
    total = []
    for layers in (2, 4):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config(num_hidden_layers=layers, **SIZES))
        saved: dict[tuple, int] = {}

        def keep(t, saved=saved):
            saved[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
            return t

        ids = torch.randint(0, 512, (1, tokens))
        with (
            torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"),
        ):
            model.model(input_ids=ids)
        total.append(sum(saved.values()))
    return (total[1] - total[0]) / 2 / tokens


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_query_and_key_norms_term_is_what_autograd_keeps_for_them(precision):
    # The same layer with and without Qwen3's per-head query and key RMSNorms: what autograd
    # keeps beyond the plain layer is the plan's term, plus the norms' own [tokens, heads] fp32
    # statistics (4 bytes a head: 48 bytes a token here, 6 % of the term).
    extra = saved_bytes_per_token_and_layer("qwen3", precision) - saved_bytes_per_token_and_layer(
        "llama", precision
    )
    width = (8 + 4) * 32  # query and key heads × head_dim
    qwen3 = ModelShape.from_config({"model_type": "qwen3", "num_hidden_layers": 1, **SIZES})
    assert qwen3.qk_norm_width == width

    def activations(shape: ModelShape) -> int:
        return dict(estimate(shape, Settings("cpu", precision, 1)).items)["activations"]

    term = activations(qwen3) - activations(replace(qwen3, qk_norm_width=0))
    assert term == width * (6 if precision == "bf16" else 8)
    assert term <= extra <= term * 1.07, (extra, term)
