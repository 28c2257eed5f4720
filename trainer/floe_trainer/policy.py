"""The policy being trained: a Hugging Face causal LM, and token log-probabilities of floe
traces under it (padded batches; response tokens only)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from .wire import Trace


@dataclass
class Batch:
    """Traces padded to one length: ``input_ids`` [B, L]; per-response-token tensors [B, R]."""

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

    def to(self, device: torch.device) -> Batch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)


def make_batch(traces: list[Trace], pad_id: int = 0) -> Batch:
    # Rows are built as Python lists and turned into tensors once: per-element tensor writes
    # cost microseconds each and left the GPU idle for a third of a bf16 step.
    length = max(len(t.prompt_token_ids) + len(t.response_token_ids) for t in traces)
    resp = max(max(len(t.response_token_ids) for t in traces), 1)
    input_ids, attention, positions, response, mask, behaviour, known = ([] for _ in range(7))
    for t in traces:
        ids = t.prompt_token_ids + t.response_token_ids
        n, p = len(t.response_token_ids), len(t.prompt_token_ids)
        pad = resp - n
        input_ids.append(ids + [pad_id] * (length - len(ids)))
        attention.append([1] * len(ids) + [0] * (length - len(ids)))
        positions.append(list(range(p - 1, p - 1 + n)) + [0] * pad if n else [0] * resp)
        response.append(t.response_token_ids + [0] * pad)
        mask.append([float(m) for m in t.loss_mask] + [0.0] * pad)
        behaviour.append([0.0 if lp is None else lp for lp in t.logprobs] + [0.0] * pad)
        known.append([lp is not None for lp in t.logprobs] + [False] * pad)
    starts = [len(t.prompt_token_ids) - 1 for t in traces if t.response_token_ids]
    return Batch(
        torch.tensor(input_ids, dtype=torch.long),
        torch.tensor(attention, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        torch.tensor(response, dtype=torch.long),
        torch.tensor(mask, dtype=torch.float32),
        torch.tensor(behaviour, dtype=torch.float64),
        torch.tensor(known, dtype=torch.bool),
        max(min(starts, default=0), 0),
    )


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Log-probability of each response token under ``model`` ([B, R], float64 for the loss).
    Logits only from the first position that predicts a response token on
    (``logits_to_keep``): agent prompts are long, and their [L, vocab] logits are never used."""
    start = batch.first_position
    keep = batch.input_ids.shape[1] - start
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep
    ).logits
    index = (batch.positions - start).clamp(min=0)
    picked = torch.gather(logits, 1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).float()
    chosen = torch.gather(picked, 2, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    return (chosen - torch.logsumexp(picked, -1)).double()
