"""A tiny random Llama for tests that need a real causal LM but no trained weights."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int = 0, positions: int = 128, **config) -> LlamaForCausalLM:
    """``config``: more of ``LlamaConfig``'s settings (an ``attention_dropout``, say)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        **config,
    )
    return LlamaForCausalLM(cfg)
