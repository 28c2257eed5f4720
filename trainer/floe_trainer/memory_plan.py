"""The memory plan: before the trainer loads a model, what one GRPO step will need on each
device it trains on, from the model's shape and the job's settings, against what the device
has. A job that cannot fit is refused with one line that names a change that makes it fit.

Every term is bytes on one training device (``P`` parameters, ``T`` tokens in the largest
forward/backward pass = ``microBatchSize`` traces of vLLM's whole context, or
``maxTokensPerMicroBatch`` when set (at least one whole trace), ``S`` the context, ``L``
layers, ``h`` hidden, ``i`` MLP width, ``V`` vocab):

- weights, gradients and AdamW's two moments: fp32 master state, ``4P + 4P + 8P`` (sharded
  over ``gpus`` when the state is sharded);
- bf16 copies of the weights that autocast keeps for the backward pass: ``2P`` (bf16 only);
- the KL reference model: ``2P`` (bf16) or ``4P`` (fp32), only with ``klCoef`` > 0 (whole on
  every process);
- sharded over several processes (FSDP2, ``distributed``): the fp32 state divided among
  them, plus two decoder layers gathered whole at a time (the logits chunked as on one
  device: ``policy.register_sharded_logprobs``); with LoRA the frozen base and the adapter
  are divided alike, a layer gathered in the base's precision;
- activations saved for the backward pass, per token and layer ``(10h + 4i)`` values (fp32:
  4 bytes each; bf16: 2, plus the two RMSNorms' fp32 upcasts ``4h × 4``). A model that
  norms each head's queries and keys (Qwen3's ``q_norm``/``k_norm``) keeps more for those
  norms: per query and key value, its input upcast to fp32 and its normalized bf16 (6 bytes;
  fp32: the input and the normalized, 8) — 15 % of Qwen3-1.7B's layer, missed until an H200
  run measured a two-pass step 11 % over the plan. With gradient checkpointing only each
  layer's input ``h`` is kept, plus one whole layer being recomputed;
- logits: ~4 ``[positions, V]`` fp32 tensors live at the loss's peak (the logits, their gather,
  and both gradients), over at most ``LOGITS_CHUNK`` positions (``policy.token_logprobs``);
- attention: on CPU, PyTorch's attention keeps one fp32 ``[heads, S, S]`` score tensor per row
  while a layer runs (measured: the forward's growth is quadratic in the length), ``T × S ×
  heads × 4`` at most; on a GPU in bf16 the fused kernels keep none, but a pass of several
  traces carries a padding mask, ``T × S`` bytes; on a GPU in fp32 PyTorch's attention takes
  its plain path, which keeps each layer's ``[heads, S, S]`` fp32 probabilities for the
  backward pass (one layer's with checkpointing) plus two more while a layer runs (measured on
  an H200: SmolLM2 at 4,096 tokens peaked at 30.0 GB where the other terms are 10.3);
- the runtime: on CPU, what the process holds before the model loads (interpreter, torch,
  transformers: measured, not assumed); on a GPU, 1 GiB for the CUDA context and kernels.

On CPU the trainer fixes glibc's mmap threshold (``placement.return_freed_memory_on_cpu``):
without it, freed activations fragment the heap and the resident peak runs 10-60 % over what
the step holds (more with LoRA's small tensors between the large ones), which earlier versions
of these terms absorbed as three score copies and 0.5 GiB "at the first step".

Checked against measured peaks on CPU (``tests/test_memory_plan.py``: SmolLM2-135M, full
training, with and without gradient checkpointing, within 20 %) and on an H200
(``scripts/trainer/gpu-scale-proof.sh``: SmolLM2-135M and Qwen3-1.7B, docs/trainer.md)."""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from .policy import LOGITS_CHUNK

log = logging.getLogger("floe_trainer")

GIB = 1024**3
# The CUDA context, cuBLAS workspaces and kernel images of a training process.
CUDA_RUNTIME = 1 * GIB
# Live [positions, vocab] fp32 tensors at the loss's peak (measured on CPU: ~4).
LOGIT_COPIES = 4
# Live [heads, T, T] fp32 attention scores while a layer runs on CPU.
CPU_SCORE_COPIES = 1
# A LoRA adapter the plan suggests when full training cannot fit, on the modules it targets by
# default (every projection of attention and MLP: ``lora.DEFAULT_TARGETS``).
SUGGESTED_RANK = 16
STATE_ITEMS = ("weights", "gradients", "AdamW state")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Live [heads, T, T] fp32 probabilities of the layer running on a GPU in fp32 (its scores and
# softmax), beside the ones kept for the backward pass.
GPU_FP32_SCORE_COPIES = 2


class MemoryPlanError(ValueError):
    """A job whose training step cannot fit the device (the message is one line)."""


class LoraTargetError(ValueError):
    """A LoRA adapter asked for on modules the model does not have (one line)."""


@dataclass(frozen=True)
class ModelShape:
    parameters: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    max_positions: int
    heads: int
    # Parameters of the largest unit a sharded engine gathers at once (a decoder layer, or the
    # embedding).
    largest_unit: int
    # The 2-D weights by their module's own name (``q_proj``): (name, how many, in, out).
    linears: tuple[tuple[str, int, int, int], ...] = ()
    # Query plus key width (heads × head_dim + kv heads × head_dim) when each head's queries
    # and keys pass through their own RMSNorm (Qwen3's q_norm / k_norm), else 0.
    qk_norm_width: int = 0

    def adapter_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        """A LoRA adapter's parameters: ``rank × (in + out)`` for every targeted weight."""
        return sum(n * rank * (i + o) for name, n, i, o in self.linears if name in targets)

    def missing_modules(self, targets: tuple[str, ...]) -> list[str]:
        names = {name for name, *_ in self.linears}
        return [t for t in targets if t not in names]

    @staticmethod
    def from_config(config: dict, shapes: dict[str, tuple[int, ...]] | None = None) -> ModelShape:
        """``config``: the model's ``config.json`` (a multimodal one's ``text_config``);
        ``shapes``: every tensor's shape by name, from the weights' headers, when known."""
        text = config.get("text_config") or config
        h = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        inter = int(text.get("intermediate_size") or 4 * h)
        vocab = int(text["vocab_size"])
        heads = int(text.get("num_attention_heads") or 1)
        head_dim = int(text.get("head_dim") or h // heads)
        kv = int(text.get("num_key_value_heads") or heads) * head_dim
        layer = h * heads * head_dim * 2 + h * kv * 2 + 3 * h * inter + 2 * h
        tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        att = heads * head_dim
        linears: dict[tuple[str, int, int], int] = {}
        if shapes:
            for name, shape in shapes.items():
                parts = name.split(".")
                # Only the modules of the repeated blocks (a numbered layer), not the token
                # embeddings nor the output head: an adapter there is no ``lora_A``/``lora_B``
                # pair the merge knows (PEFT's embedding one is ``lora_embedding_*``: the final
                # merge failed after the whole run), and a tied head's merged delta would be
                # tied back to the embeddings by whoever loads the model.
                if not any(p.isdigit() for p in parts):
                    continue
                if len(shape) == 2 and parts[-1] == "weight" and len(parts) > 1:
                    key = (parts[-2], int(shape[1]), int(shape[0]))
                    linears[key] = linears.get(key, 0) + 1
        else:
            for module, i, o in [
                ("q_proj", h, att),
                ("k_proj", h, kv),
                ("v_proj", h, kv),
                ("o_proj", att, h),
                ("gate_proj", h, inter),
                ("up_proj", h, inter),
                ("down_proj", inter, h),
            ]:
                linears[(module, i, o)] = layers
        counted = None
        if shapes:
            counted = {}
            for name, shape in shapes.items():
                n = 1
                for d in shape:
                    n *= int(d)
                counted[name] = n
        if counted:
            parameters = sum(counted.values())
            per_layer: dict[str, int] = {}
            for name, n in counted.items():
                unit = _layer_of(name)
                if unit is not None:
                    per_layer[unit] = per_layer.get(unit, 0) + n
            layer = max(per_layer.values(), default=layer)
        else:
            parameters = vocab * h * (1 if tied else 2) + layers * layer + h
        return ModelShape(
            parameters=parameters,
            layers=layers,
            hidden=h,
            intermediate=inter,
            vocab=vocab,
            max_positions=int(text.get("max_position_embeddings") or 0),
            heads=heads,
            largest_unit=max(layer, vocab * h),
            linears=tuple((name, n, i, o) for (name, i, o), n in sorted(linears.items())),
            qk_norm_width=att + kv if _norms_queries_and_keys(text, shapes) else 0,
        )

    @staticmethod
    def from_dir(path: Path) -> ModelShape:
        """A model directory: ``config.json`` and, when present, the safetensors headers (the
        exact parameter count, without reading any weight)."""
        config = json.loads((path / "config.json").read_text())
        return ModelShape.from_config(config, safetensors_shapes(path) or None)


def _norms_queries_and_keys(text: dict, shapes: dict[str, tuple[int, ...]] | None) -> bool:
    """Whether attention norms each head's queries and keys: from the weights' names when
    known, else from the architecture (the Qwen3 family)."""
    if shapes:
        return any(name.endswith(("q_norm.weight", "k_norm.weight")) for name in shapes)
    return str(text.get("model_type", "")).startswith("qwen3")


def _layer_of(name: str) -> str | None:
    parts = name.split(".")
    for k, part in enumerate(parts[:-1]):
        if part in ("layers", "h", "blocks") and parts[k + 1].isdigit():
            return ".".join(parts[: k + 2])
    return None


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, read from each safetensors file's JSON header (8-byte length,
    then the header); empty when the directory has none."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(path.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(int(d) for d in meta["shape"])
    return shapes


@dataclass(frozen=True)
class Settings:
    device: str  # "cuda" | "cpu"
    precision: str  # "bf16" | "fp32"
    # Tokens of the longest trace a step may see (vLLM's context length).
    sequence: int
    micro_batch: int = 1
    # ``maxTokensPerMicroBatch``: a pass holds at most this many tokens (or one whole trace).
    max_tokens: int | None = None
    gradient_checkpointing: bool = False
    reference: bool = False
    # Devices the weights, gradients and optimizer state are sharded over.
    shards: int = 1
    logits_chunk: int = LOGITS_CHUNK
    # CPU: bytes the process holds before the model loads (measured by the caller).
    runtime: int = 0
    # ``train.lora``: the adapter's parameters (only they train); None: every weight trains.
    adapter: int | None = None

    @property
    def tokens(self) -> int:
        """Tokens of the largest pass: ``micro_batch`` traces of the whole context, or the
        token budget (never less than one whole trace)."""
        whole = max(self.micro_batch, 1) * max(self.sequence, 1)
        if self.max_tokens is None:
            return whole
        return max(min(whole, self.max_tokens), self.sequence)


@dataclass(frozen=True)
class Plan:
    settings: Settings
    # (what, bytes), in the order printed.
    items: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(b for _, b in self.items)

    def describe(self) -> str:
        parts = ", ".join(f"{what} {b / GIB:.1f}" for what, b in self.items if b)
        return f"{self.total / GIB:.1f} GiB ({parts})"

    def as_json(self) -> dict:
        return {
            "totalBytes": self.total,
            "items": {what: b for what, b in self.items},
            "tokensPerMicroBatch": self.settings.tokens,
        }


def estimate(shape: ModelShape, s: Settings) -> Plan:
    p, h, i = shape.parameters, shape.hidden, shape.intermediate
    bf16 = s.precision == "bf16"
    shards = max(s.shards, 1)
    value = 2 if bf16 else 4
    tokens = s.tokens
    per_token_layer = (10 * h + 4 * i) * value + (16 * h if bf16 else 0)
    per_token_layer += shape.qk_norm_width * (6 if bf16 else 8)
    if s.gradient_checkpointing:
        activations = tokens * (shape.layers * h * value + per_token_layer)
    else:
        activations = tokens * shape.layers * per_token_layer
    positions = min(tokens, max(s.logits_chunk, 1) * max(s.micro_batch, 1))
    logits = positions * shape.vocab * (4 * LOGIT_COPIES + (2 if bf16 else 0))
    # Rows × length² is largest for the longest rows the pass allows: tokens × the context.
    pairs = tokens * max(s.sequence, 1)
    if s.device == "cpu":
        attention = pairs * shape.heads * 4 * CPU_SCORE_COPIES
    elif not bf16:
        kept = 1 if s.gradient_checkpointing else shape.layers
        attention = pairs * shape.heads * 4 * (kept + GPU_FP32_SCORE_COPIES)
    else:
        attention = pairs if tokens > s.sequence else 0
    if shards > 1:
        # FSDP gathers one unit's fp32 weights at a time (and prefetches the next); autocast
        # keeps its bf16 casts of them.
        copies = ("gathered layers", 2 * shape.largest_unit * (4 + (2 if bf16 else 0)))
    else:
        copies = ("bf16 weight copies", 2 * p if bf16 else 0)
    if s.adapter is not None:
        # LoRA: the frozen base in the precision it computes in (no bf16 copies), the
        # adapter in fp32 with its gradients and AdamW state; sharded, both are divided and
        # a unit is gathered in the base's own precision.
        a = s.adapter
        weights, trained = (value * p + 4 * a) // shards, a // shards
        copies = (
            ("gathered layers", 2 * shape.largest_unit * value)
            if shards > 1
            else ("bf16 weight copies", 0)
        )
    else:
        weights, trained = 4 * p // shards, p // shards
    items = (
        ("weights", weights),
        ("gradients", 4 * trained),
        ("AdamW state", 8 * trained),
        copies,
        # Replicated on every process (it only runs forward). A LoRA policy's reference is
        # itself with the adapter off: no second copy.
        ("reference model", value * p if s.reference and s.adapter is None else 0),
        ("activations", activations),
        ("attention", attention),
        ("logits", logits),
        ("runtime", CUDA_RUNTIME if s.device == "cuda" else s.runtime),
    )
    return Plan(s, items)


def check(shape: ModelShape, s: Settings, capacity: int, device_name: str) -> Plan:
    """The plan, or ``MemoryPlanError`` with one line: what the step needs, what the device
    has, and the first single change (in the order a user would try them) that fits."""
    plan = estimate(shape, s)
    if plan.total <= capacity:
        return plan
    have = capacity / GIB
    line = f"memory plan: a training step needs {plan.describe()} on each {device_name}"
    line += f", which has {have:.1f} GiB"
    for change, changed in _changes(s, shape):
        alt = estimate(shape, changed)
        if alt.total <= capacity:
            raise MemoryPlanError(f"{line}: {change} ({alt.total / GIB:.1f} GiB)")
    # Every setting that trades speed for memory, and the longest context that then fits.
    together, names = _all_knobs(s, shape)
    longest = _longest_fitting(shape, together, capacity)
    if longest:
        also = f"set {' and '.join(names)}, and " if names else ""
        alt = estimate(shape, replace(together, sequence=longest))
        raise MemoryPlanError(
            f"{line}: {also}shorten the context to {longest} tokens (vLLM's --max-model-len, "
            f"now {s.sequence}) ({alt.total / GIB:.1f} GiB)"
        )
    least = replace(together, sequence=1)
    state = sum(b for what, b in estimate(shape, least).items if what in STATE_ITEMS) / GIB
    even = "even with a LoRA adapter, " if s.adapter is None and least.adapter is not None else ""
    raise MemoryPlanError(
        f"{line}; no setting makes it fit ({even}the weights, gradients and AdamW state alone "
        f"are {state:.1f} GiB): use a smaller model or a device with more memory"
    )


def _longest_fitting(shape: ModelShape, s: Settings, capacity: int) -> int | None:
    """The longest context (a multiple of 1,024 tokens when that long) that fits, if any."""
    low, high = 0, s.sequence - 1
    while low < high:
        mid = (low + high + 1) // 2
        if estimate(shape, replace(s, sequence=mid)).total <= capacity:
            low = mid
        else:
            high = mid - 1
    if low >= 1024:
        low -= low % 1024
    return low or None


def _knobs(s: Settings, shape: ModelShape) -> list[tuple[str, dict]]:
    knobs: list[tuple[str, dict]] = []
    if not s.gradient_checkpointing:
        knobs.append(("grpo.gradientCheckpointing: true", {"gradient_checkpointing": True}))
    if s.micro_batch > 1 and s.max_tokens is None:
        # Short traces still packed several a pass; a long one alone.
        knobs.append((f"grpo.maxTokensPerMicroBatch: {s.sequence}", {"max_tokens": s.sequence}))
    if s.micro_batch > 1:
        knobs.append((f"grpo.microBatchSize: 1 (now {s.micro_batch})", {"micro_batch": 1}))
    if s.reference and s.adapter is None:
        knobs.append(("grpo.klCoef: 0 (no reference model)", {"reference": False}))
    if s.device == "cuda" and s.precision != "bf16":
        knobs.append(("grpo.precision: BF16", {"precision": "bf16"}))
    adapter = shape.adapter_parameters(SUGGESTED_RANK, LORA_TARGETS)
    if s.adapter is None and s.shards == 1 and adapter:
        # Last: it changes what trains, not only how.
        knobs.append((f"train.lora.rank: {SUGGESTED_RANK} (a LoRA adapter)", {"adapter": adapter}))
    return knobs


def _combinable(s: Settings, shape: ModelShape) -> list[tuple[str, dict]]:
    knobs = _knobs(s, shape)
    if any("micro_batch" in change for _, change in knobs):
        # One trace a pass: a token budget adds nothing.
        knobs = [(w, c) for w, c in knobs if "max_tokens" not in c]
    return knobs


def _all_knobs(s: Settings, shape: ModelShape) -> tuple[Settings, list[str]]:
    together, names = s, []
    for what, change in _combinable(s, shape):
        together, names = replace(together, **change), [*names, what]
    return together, names


def _changes(s: Settings, shape: ModelShape) -> list[tuple[str, Settings]]:
    """Single changes first, then the same ones together (the context is left as it is)."""
    out = [(f"set {what}", replace(s, **change)) for what, change in _knobs(s, shape)]
    together, names = s, []
    for what, change in _combinable(s, shape):
        together, names = replace(together, **change), [*names, what]
        if len(names) > 1:
            out.append(("set " + " and ".join(names), together))
    return out


def resident_bytes() -> int:
    """This process's resident memory now (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def capacity(device: str) -> tuple[int, str]:
    """Bytes one training device offers, and what to call it: a GPU's total memory, or on CPU
    the smaller of the container's memory limit (cgroup v2 or v1) and the memory available
    now plus what this process already holds."""
    if device == "cuda":
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(props.total_memory), f"GPU ({props.name})"
    limits = []
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(f).read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:
            limits.append(int(raw))
    meminfo = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        meminfo[key] = int(rest.split()[0]) * 1024 if rest.split() else 0
    limits.append(meminfo.get("MemAvailable", meminfo.get("MemTotal", 0)) + resident_bytes())
    return min(limits), "CPU (memory available to the trainer)"


MODES = ("enforce", "warn")


def review(
    model_dir: Path,
    device: str,
    precision: str,
    max_sequence_tokens: int | None,
    micro_batch: int,
    gradient_checkpointing: bool,
    reference: bool,
    mode: str = "enforce",
    max_tokens: int | None = None,
    shards: int = 1,
    lora: tuple[int, tuple[str, ...]] | None = None,
) -> tuple[Plan, int] | None:
    """A trainer's plan before it loads its model, with the device's capacity: refused
    (``MemoryPlanError``) when it cannot fit and ``mode`` is ``enforce``, logged when ``warn``.
    ``None`` when there is nothing to plan from (a model name rather than a directory). On CPU
    the runtime term is what this process holds now: call it after importing torch and
    transformers, before loading the model. ``lora``: (rank, target modules) of an adapter;
    a target the model does not have is refused here too (``LoraTargetError``)."""
    if not (model_dir / "config.json").is_file():
        log.warning("memory plan: %s has no config.json here; not checked", model_dir)
        return None
    shape = ModelShape.from_dir(model_dir)
    adapter = None
    if lora is not None:
        rank, targets = lora
        missing = shape.missing_modules(targets)
        if missing:
            have = sorted({name for name, *_ in shape.linears})
            raise LoraTargetError(
                f"train.lora.targetModules: {', '.join(missing)} not in {model_dir.name} "
                f"(its linear modules: {', '.join(have)})"
            )
        adapter = shape.adapter_parameters(rank, targets)
    sequence = max_sequence_tokens or shape.max_positions
    if not sequence:
        log.warning("memory plan: no context length for %s; not checked", model_dir)
        return None
    settings = Settings(
        device=device,
        precision=precision,
        sequence=sequence,
        micro_batch=micro_batch,
        gradient_checkpointing=gradient_checkpointing,
        reference=reference,
        runtime=resident_bytes(),
        max_tokens=max_tokens,
        shards=shards,
        adapter=adapter,
    )
    have, name = capacity(settings.device)
    try:
        plan = check(shape, settings, have, name)
    except MemoryPlanError as e:
        if mode != "warn":
            raise
        log.warning("%s (memoryPlan: Warn, starting anyway)", e)
        plan = estimate(shape, settings)
    log.info("memory plan: %s per %s of %.1f GiB", plan.describe(), name, have / GIB)
    return plan, have
