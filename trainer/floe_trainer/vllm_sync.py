"""New weights into a running vLLM server without restarting it: save the model as
safetensors into the directory vLLM loaded, then ``/pause`` → ``/collective_rpc``
``reload_weights`` → ``/reset_prefix_cache`` (cached KV was computed by the old weights) →
``/resume``. These are vLLM's dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``); verified
against vLLM 0.32 on CPU. On GPUs ``grpo.weightSync: NCCL`` replaces the file round trip
(``nccl_sync.py``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import torch
from safetensors.torch import save_file


def post(url: str, body: dict | None = None, timeout: float = 600) -> dict:
    """A control call to vLLM (pause, resume, cache reset, ...); its JSON answer."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body or {}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def save_weights(model: torch.nn.Module, directory: Path) -> None:
    """``model.safetensors`` replaced atomically (vLLM must never read a half-written file)."""
    state = {
        k: v.detach().to("cpu", copy=False).contiguous() for k, v in model.state_dict().items()
    }
    tmp = directory / ".model.safetensors.tmp"
    save_file(state, str(tmp))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, directory / "model.safetensors")


def push(model: torch.nn.Module, vllm_url: str, model_dir: Path) -> dict[str, float]:
    """Returns seconds spent saving and in the server (paused time)."""
    t0 = time.monotonic()
    save_weights(model, model_dir)
    t1 = time.monotonic()
    post(f"{vllm_url}/pause")
    try:
        post(
            f"{vllm_url}/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}},
        )
        post(f"{vllm_url}/reset_prefix_cache")
    finally:
        post(f"{vllm_url}/resume")
    return {"save_seconds": t1 - t0, "paused_seconds": time.monotonic() - t1}


class FileWeightSync:
    """``push`` with the model and where vLLM reloads from bound (the trainer's default)."""

    def __init__(self, model: torch.nn.Module, vllm_url: str, model_dir: Path) -> None:
        self.model, self.url, self.dir = model, vllm_url, model_dir

    def push(self) -> dict[str, float]:
        return push(self.model, self.url, self.dir)


def wait_healthy(url: str, timeout: float = 1800.0, every: float = 2.0) -> None:
    """Until vLLM answers ``/health`` (it may still be loading the model when the trainer
    starts): a push or the NCCL rendezvous needs it up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=10) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"vLLM at {url} not healthy after {timeout:.0f} s")
        time.sleep(every)


def prompt_logprobs(vllm_url: str, model: str, ids: list[int]) -> list[float]:
    """vLLM's log-probability of each token of ``ids`` after the first."""
    req = urllib.request.Request(
        f"{vllm_url}/v1/completions",
        data=json.dumps(
            {"model": model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
        ).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read())
    per_pos = out["choices"][0]["prompt_logprobs"]
    return [
        next(v["logprob"] for k, v in d.items() if int(k) == tok)
        for d, tok in zip(per_pos[1:], ids[1:], strict=True)
    ]
