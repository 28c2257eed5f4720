"""Sampling with the trainer's own model (Hugging Face ``generate``), in the shape of a vLLM
completion choice (``token_ids``, ``logprobs.token_logprobs``). Only for ``learn_demo`` on a
machine where no vLLM can run (the GPU proof: vLLM's CUDA build cannot be installed there);
the trainer pod always samples through vLLM. Weights need no push: it shares the model."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from .placement import Placement


class LocalSampler:
    def __init__(self, model: torch.nn.Module, eos_id: int, placement: Placement) -> None:
        self.model = model
        self.eos_id = eos_id
        self.placement = placement

    def sample(self, prompt: list[int], n: int, seed: int, max_tokens: int) -> list[dict]:
        # Pure temperature-1 sampling, so the recorded logprobs are the behaviour policy's.
        gen = GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            num_return_sequences=n,
            eos_token_id=self.eos_id,
            pad_token_id=self.eos_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        torch.manual_seed(seed)
        ids = torch.tensor([prompt], device=self.placement.device)
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), self.placement.autocast():
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen
            )
            scores = self.model.compute_transition_scores(
                out.sequences, out.scores, normalize_logits=True
            )
        self.model.train(was_training)
        choices = []
        for row, lps in zip(out.sequences[:, len(prompt) :].tolist(), scores.tolist(), strict=True):
            end = row.index(self.eos_id) + 1 if self.eos_id in row else len(row)
            choices.append({"token_ids": row[:end], "logprobs": {"token_logprobs": lps[:end]}})
        return choices

    def push(self, model: torch.nn.Module) -> None:
        """Nothing to do: the sampler generates with the trained model itself."""
