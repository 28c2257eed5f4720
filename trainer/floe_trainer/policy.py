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

    def to(self, device: torch.device) -> Batch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def make_batch(traces: list[Trace], pad_id: int = 0) -> Batch:
    length = max(len(t.prompt_token_ids) + len(t.response_token_ids) for t in traces)
    resp = max(max(len(t.response_token_ids) for t in traces), 1)
    b = len(traces)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    positions = torch.zeros((b, resp), dtype=torch.long)
    response = torch.zeros((b, resp), dtype=torch.long)
    mask = torch.zeros((b, resp))
    behaviour = torch.zeros((b, resp), dtype=torch.float64)
    known = torch.zeros((b, resp), dtype=torch.bool)
    for i, t in enumerate(traces):
        ids = t.prompt_token_ids + t.response_token_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        n, p = len(t.response_token_ids), len(t.prompt_token_ids)
        if n == 0:
            continue
        positions[i, :n] = torch.arange(p - 1, p - 1 + n)
        response[i, :n] = torch.tensor(t.response_token_ids)
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        for j, lp in enumerate(t.logprobs):
            if lp is not None:
                behaviour[i, j] = lp
                known[i, j] = True
    return Batch(input_ids, attention, positions, response, mask, behaviour, known)


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Log-probability of each response token under ``model`` ([B, R], float64 for the loss)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    picked = torch.gather(logits, 1, batch.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    logp = picked.float().log_softmax(-1)
    return torch.gather(logp, 2, batch.response_ids.unsqueeze(-1)).squeeze(-1).double()
