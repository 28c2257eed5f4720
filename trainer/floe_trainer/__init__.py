"""floe's GRPO trainer: ingest floe trajectories, group them, train, push weights to vLLM."""

__version__ = "0.1.0"
