"""The policy being trained: a Hugging Face causal LM, and token log-probabilities of floe
traces under it (padded batches, or rows shared by traces that begin alike: ``sharing``;
response tokens only)."""

from __future__ import annotations

import types
from dataclasses import dataclass, fields, replace

import torch
from torch.utils.checkpoint import checkpoint

from .sharing import Row
from .wire import Trace


@dataclass
class Batch:
    """Traces padded to one length: ``input_ids`` [B, L]; per-response-token tensors [B, R].
    Shared (``make_shared_batch``): ``input_ids`` [rows, L], a 4-D ``attention_mask``,
    ``position_ids``, and ``row_of`` [B], the row holding each trace."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    # Index into the logits row that predicts each response token: prompt_len - 1 + j.
    positions: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    behaviour: torch.Tensor
    behaviour_known: torch.Tensor
    # The first logits row any response token needs (rows before it predict prompt tokens).
    first_position: int = 0
    # The sampling temperature: log-probs are of ``softmax(logits / temperature)``, the
    # distribution the tokens were drawn from (vLLM reports those with
    # ``--logprobs-mode processed_logprobs``), so the PPO ratio and TIS weigh the right policy.
    temperature: float = 1.0
    position_ids: torch.Tensor | None = None
    row_of: torch.Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)


def make_batch(traces: list[Trace], pad_id: int = 0, temperature: float = 1.0) -> Batch:
    # Rows are built as Python lists and turned into tensors once: per-element tensor writes
    # cost microseconds each and left the GPU idle for a third of a bf16 step.
    length = max(len(t.prompt_token_ids) + len(t.response_token_ids) for t in traces)
    resp = max(max(len(t.response_token_ids) for t in traces), 1)
    input_ids, attention, positions = [], [], []
    for t in traces:
        ids = t.prompt_token_ids + t.response_token_ids
        n, p = len(t.response_token_ids), len(t.prompt_token_ids)
        input_ids.append(ids + [pad_id] * (length - len(ids)))
        attention.append([1] * len(ids) + [0] * (length - len(ids)))
        positions.append(list(range(p - 1, p - 1 + n)) + [0] * (resp - n) if n else [0] * resp)
    starts = [len(t.prompt_token_ids) - 1 for t in traces if t.response_token_ids]
    return Batch(
        torch.tensor(input_ids, dtype=torch.long),
        torch.tensor(attention, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        *_response_columns(traces, resp),
        max(min(starts, default=0), 0),
        temperature,
    )


def _response_columns(
    traces: list[Trace], width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per response token of each trace, padded to ``width``: the token, its loss mask, its
    behaviour log-prob (0 where unknown) and whether that is known."""
    response, mask, behaviour, known = ([] for _ in range(4))
    for t in traces:
        pad = width - len(t.response_token_ids)
        response.append(t.response_token_ids + [0] * pad)
        mask.append([float(m) for m in t.loss_mask] + [0.0] * pad)
        behaviour.append([0.0 if lp is None else lp for lp in t.logprobs] + [0.0] * pad)
        known.append([lp is not None for lp in t.logprobs] + [False] * pad)
    return (
        torch.tensor(response, dtype=torch.long),
        torch.tensor(mask, dtype=torch.float32),
        torch.tensor(behaviour, dtype=torch.float64),
        torch.tensor(known, dtype=torch.bool),
    )


def make_shared_batch(
    traces: list[Trace],
    rows: list[Row],
    pad_id: int = 0,
    temperature: float = 1.0,
    attention: str = "sdpa",
) -> Batch:
    """``traces`` laid out in ``rows`` (``sharing.layout``): each row the prefix tree of its
    members' tokens, depth first; a token attends to its own path from the root only, at the
    position its depth gives, so each trace's log-probs are the ones it has alone.
    ``attention``: the model's attention implementation, which decides the mask's form (SDPA
    takes booleans, eager an additive float mask)."""
    width = max(r.width for r in rows)
    allowed = torch.zeros(len(rows), 1, width, width, dtype=torch.bool)
    input_ids, position_ids = [], []
    row_of, positions = [0] * len(traces), [[0]] * len(traces)
    resp = max(max(len(t.response_token_ids) for t in traces), 1)
    for r, row in enumerate(rows):
        ids: list[int] = []
        depth: list[int] = []
        # The path from the root of the member before, as runs of the row: (first depth,
        # first row index, tokens); a few runs, where a token list would be tens of thousands.
        path: list[tuple[int, int, int]] = []
        for m, common in zip(row.members, row.shared, strict=True):
            t = traces[m]
            seq = t.prompt_token_ids + t.response_token_ids
            at, new = len(ids), len(seq) - common
            ids += seq[common:]
            depth += range(common, len(seq))
            path = [(d, i, min(n, common - d)) for d, i, n in path if d < common]
            # The new tokens see the path they branch from and, causally, each other.
            for _, i, n in path:
                allowed[r, 0, at : at + new, i : i + n] = True
            allowed[r, 0, at : at + new, at : at + new] = torch.ones(
                new, new, dtype=torch.bool
            ).tril()
            if new:
                path.append((common, at, new))
            row_of[m] = r
            # The row index of the hidden state predicting each response token: the token
            # before it on this trace's path.
            n = len(t.response_token_ids)
            before = [_row_index(path, max(len(t.prompt_token_ids) - 1 + j, 0)) for j in range(n)]
            positions[m] = before + [0] * (resp - n)
        # Padding attends to itself only (a query attending to nothing gives NaN in SDPA).
        for k in range(len(ids), width):
            allowed[r, 0, k, k] = True
        input_ids.append(ids + [pad_id] * (width - len(ids)))
        position_ids.append(depth + [0] * (width - len(depth)))
    if attention == "eager":
        mask4d = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    else:
        mask4d = allowed
    return Batch(
        torch.tensor(input_ids, dtype=torch.long),
        mask4d,
        torch.tensor(positions, dtype=torch.long),
        *_response_columns(traces, resp),
        0,
        temperature,
        torch.tensor(position_ids, dtype=torch.long),
        torch.tensor(row_of, dtype=torch.long),
    )


def _row_index(path: list[tuple[int, int, int]], d: int) -> int:
    """The row index of the token at depth ``d`` of a path (runs of the row)."""
    for first, i, n in reversed(path):
        if first <= d < first + n:
            return i + d - first
    raise IndexError(f"depth {d} is not on the path")


# Attention implementations whose 4-D masks transformers passes through as given.
_SHARED_MASKS = ("sdpa", "eager")


def sharing_hidden(model: torch.nn.Module) -> int | None:
    """The hidden size ``sharing`` weighs a layout's cost with, or None when this model cannot
    take shared rows: logits other than ``lm_head(decoder(...))``, an attention implementation
    that takes no custom mask (FlashAttention), sliding-window layers (a custom mask replaces
    the window), or a multimodal config (its position ids are not one per token)."""
    config = getattr(model, "config", None)
    if config is None or not _chunkable(model):
        return None
    if getattr(config, "_attn_implementation", None) not in _SHARED_MASKS:
        return None
    window = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    if window or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return None
    if hasattr(config, "vision_config") or hasattr(config, "text_config"):
        return None
    hidden = getattr(config, "hidden_size", None)
    return hidden if isinstance(hidden, int) and hidden > 0 else None


# Response positions whose logits exist at once. A trace's logits are [R, vocab] floats, and
# the loss keeps ~4 such tensors alive through the backward pass: 40 GB for a 16K-token Qwen3
# response (vocab 151,936). In chunks, each recomputed in the backward pass, they are a
# chunk's worth (a second lm_head matmul per chunk: a few % of a step).
LOGITS_CHUNK = 1024

# Configs whose logits are not just ``lm_head(hidden)``: these models take the plain path
# (Gemma's soft cap, Cohere's scale, Granite's, Falcon-H1's multiplier, Inkling's muP divisor;
# read on a composite model's text config too, which attribute lookups do not reach).
_LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "lm_head_multiplier",
    "logits_mup_width_multiplier",
)


def token_logprobs(model: torch.nn.Module, batch: Batch, chunk: int | None = None) -> torch.Tensor:
    """Log-probability of each response token under ``model`` ([B, R], float64 for the loss).
    Only the hidden states that predict a response token reach the output head, ``chunk``
    positions at a time (default ``LOGITS_CHUNK``); agent prompts are long and their logits
    are never needed."""
    return _logprobs(model, batch, chunk, entropy=False)[0]


def token_logprobs_and_entropy(
    model: torch.nn.Module, batch: Batch, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs``, and the (tempered) policy's entropy at each response position
    ([B, R], float32, without grad): ``logsumexp(z) - sum(softmax(z) * z)`` over the
    vocabulary, from the logits the log-probs are taken from (each chunk's, once more)."""
    logp, entropy = _logprobs(model, batch, chunk, entropy=True)
    assert entropy is not None
    return logp, entropy


def _logprobs(
    model: torch.nn.Module, batch: Batch, chunk: int | None, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not _chunkable(model):
        return _logprobs_whole(model, batch, entropy)
    chunk = chunk or LOGITS_CHUNK
    sharded = getattr(model, SHARDED_LOGPROBS, None)
    if sharded is not None:
        return sharded(batch, chunk, entropy)
    return _chunked_logprobs(model, batch, chunk, entropy)


# The chunked log-probs as a forward method of a model sharded with FSDP2
# (``register_sharded_logprobs``).
SHARDED_LOGPROBS = "floe_chunked_logprobs"


def register_sharded_logprobs(model: torch.nn.Module) -> None:
    """FSDP2 gathers the root's weights (embeddings, final norm, head) around the model's
    ``forward`` only, and the chunked log-probs call the decoder and the head apart. Registered
    as a forward method of the sharded model (PyTorch's ``register_fsdp_forward_method``), they
    gather them as its forward would, so a sharded step keeps a chunk of logits too, not every
    position's. A no-op for a model that is not sharded or takes the plain path."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    if not isinstance(model, FSDPModule) or not _chunkable_shape(model):
        return
    setattr(model, SHARDED_LOGPROBS, types.MethodType(_chunked_logprobs, model))
    register_fsdp_forward_method(model, SHARDED_LOGPROBS)


def _chunked_logprobs(
    model: torch.nn.Module, batch: Batch, chunk: int, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = model.get_decoder()(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    if batch.row_of is None:
        # [B, R, H]: the row that predicts each response token.
        index = batch.positions.clamp(min=0).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        rows = torch.gather(hidden, 1, index)
    else:
        # Shared rows: trace b's hidden states are in row ``row_of[b]`` (a shared beginning's
        # in every member's; its gradient sums theirs, as the traces' own copies would).
        width = hidden.shape[1]
        flat = batch.row_of.unsqueeze(-1) * width + batch.positions.clamp(min=0)
        rows = hidden.reshape(-1, hidden.shape[-1])[flat]
    head = model.get_output_embeddings()
    parts, entropies = [], []
    for a in range(0, rows.shape[1], max(chunk, 1)):
        ids = batch.response_ids[:, a : a + chunk]
        part = rows[:, a : a + chunk]
        if torch.is_grad_enabled() and rows.shape[1] > chunk:
            # Keep only this chunk's hidden rows for the backward pass, not its logits.
            logp, ent = checkpoint(
                _chosen_logprobs,
                head,
                part,
                ids,
                batch.temperature,
                entropy,
                use_reentrant=False,
            )
        else:
            logp, ent = _chosen_logprobs(head, part, ids, batch.temperature, entropy)
        parts.append(logp)
        entropies.append(ent)
    together = torch.cat(entropies, dim=1) if entropy else None
    return torch.cat(parts, dim=1).double(), together


def _chosen_logprobs(
    head: torch.nn.Module,
    rows: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = _tempered(head(rows).float(), temperature)
    chosen = torch.gather(logits, 2, ids.unsqueeze(-1)).squeeze(-1)
    lse = torch.logsumexp(logits, -1)
    return chosen - lse, _entropy(logits, lse) if entropy else None


def _entropy(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Per position, without grad: a measurement, never a term of the loss."""
    with torch.no_grad():
        return lse - (torch.softmax(logits, -1) * logits).sum(-1)


def _chunkable(model: torch.nn.Module) -> bool:
    # Sharded, only through the registered forward method (the root's weights gathered).
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule) and not hasattr(model, SHARDED_LOGPROBS):
        return False
    return _chunkable_shape(model)


def _chunkable_shape(model: torch.nn.Module) -> bool:
    """Logits that are just ``lm_head(decoder(...))``, with both reachable apart."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    transformed = (getattr(c, k, None) for c in (config, text) for k in _LOGIT_TRANSFORMS)
    if any(v not in (None, 1, 1.0) for v in transformed):
        return False
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    return decoder is not None and decoder is not model and isinstance(head, torch.nn.Linear)


def _logprobs_whole(
    model: torch.nn.Module, batch: Batch, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's own forward with ``logits_to_keep`` (models whose logits are transformed)."""
    start = batch.first_position
    keep = batch.input_ids.shape[1] - start
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep
    ).logits
    index = (batch.positions - start).clamp(min=0)
    picked = torch.gather(logits, 1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).float()
    picked = _tempered(picked, batch.temperature)
    chosen = torch.gather(picked, 2, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    lse = torch.logsumexp(picked, -1)
    return (chosen - lse).double(), _entropy(picked, lse) if entropy else None


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature == 1.0 else logits / temperature


def train_deterministically(model: torch.nn.Module) -> torch.nn.Module:
    """``model.train()`` only where a training pass needs it: the modules with HF's
    ``gradient_checkpointing`` switch (a model, its decoder layers), which checkpoint only in
    training mode; every other module in eval mode, as vLLM samples and as the old log-probs and
    the fidelity check are taken. A mixture-of-experts block in training mode samples noise
    nothing served: Mixtral's, MiniMax's and DBRX's router jitter, PhiMoE's sparsemixer, which
    picks experts by Gumbel sampling; :func:`without_dropout` covers dropout under any name."""
    model.train()
    for module in model.modules():
        module.training = hasattr(module, "gradient_checkpointing")
    return model


def without_dropout(model: torch.nn.Module) -> list[str]:
    """Every dropout of ``model`` set to 0; the names changed. vLLM samples without dropout, and
    the old log-probs and the fidelity check are taken in eval mode: a training pass with
    dropout would compute the gradient of a noisier policy nothing sampled (the first update's
    ratio off 1, the clip firing on noise). HF attention keeps its rate as a float on the
    module (``attention_dropout``), not as an ``nn.Dropout``: both are zeroed. The model's
    config (saved with checkpoints) is left as it is."""
    changed = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            module.p = 0.0
            changed.append(name)
            continue
        for attr, value in list(vars(module).items()):
            if "dropout" in attr and isinstance(value, float) and value > 0:
                setattr(module, attr, 0.0)
                changed.append(f"{name}.{attr}")
    return changed
