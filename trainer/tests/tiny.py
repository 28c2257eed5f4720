"""A tiny random Llama for tests that need a real causal LM but no trained weights."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# The tiny models' shape, whatever their architecture.
TINY_SHAPE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def tiny_llama(seed: int = 0, positions: int = 128, **config) -> LlamaForCausalLM:
    """``config``: more of ``LlamaConfig``'s settings (an ``attention_dropout``, say)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(**TINY_SHAPE, max_position_embeddings=positions, **config)
    return LlamaForCausalLM(cfg)


def closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tiny_trainer(tmp_path, num_samples: int, config: dict | None = None, **grpo):
    """A CPU trainer of ``tiny_llama`` whose policy server is not there (its pushes fail and
    are tried again later): the trainer's own path from ingest to step, with ``grpo`` (and the
    rest of ``config``, the operator's keys)."""
    from floe_trainer.trainer import Trainer, TrainerConfig

    model_dir = tmp_path / "model"
    tiny_llama().save_pretrained(model_dir)
    conf = {
        "model": str(model_dir),
        "policyUrl": f"http://127.0.0.1:{closed_port()}",
        "numSamples": num_samples,
        "grpo": {"groupsPerStep": 1, "microBatchSize": 4, **grpo},
        "device": "cpu",
        "memoryPlan": "Warn",
        **(config or {}),
    }
    return Trainer(TrainerConfig.from_operator(conf, tmp_path / "state"))
