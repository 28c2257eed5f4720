"""New weights into a running vLLM server without restarting it: save the model as
safetensors into the directory vLLM loaded, then ``/pause?mode=wait`` → ``/collective_rpc``
``reload_weights`` → ``/reset_prefix_cache`` (cached KV was computed by the old weights) →
``/update_weight_version`` → ``/resume``. These are vLLM's dev-mode endpoints
(``VLLM_SERVER_DEV_MODE=1``); verified against vLLM 0.32 on CPU. On GPUs ``grpo.weightSync:
NCCL`` replaces the file round trip (``nccl_sync.py``).

Requests in flight across a push: ``mode=wait`` lets every running completion finish on the
weights it started with, holds new ones until ``/resume``, so no completion mixes two policies
(``abort``, vLLM's default, would turn every push into failed agent calls; ``keep`` would
resume frozen requests on the new weights). The version label is set while generation is
paused, so it changes exactly when the weights do; vLLM restarts with ``"default"`` (the base
weights: version 0), which is how the trainer notices a restarted server.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from . import durable


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


# What vLLM's ``/weight_info`` says before any label was set: the weights it loaded at start.
BASE_VERSION_LABEL = "default"


Weights = Callable[[], "dict[str, torch.Tensor]"]


def push_dtype(serving: str | None) -> torch.dtype | None:
    """The dtype the File push writes: the one vLLM serves in, when the job says it (its
    ``--dtype``, passed as ``servingDtype``), so the file is no larger than what vLLM keeps
    (bf16: half of fp32's bytes to write and read). Otherwise None: the fp32 weights as
    trained. With ``auto`` vLLM's choice depends on its platform (a bf16 checkpoint is served
    in fp16 on GPUs without bf16, in fp32 on some CPUs): a file narrower than what vLLM keeps
    would round the weights, so nothing is guessed."""
    names = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    return names.get(serving) if serving is not None else None


def weights_state(
    model: torch.nn.Module | dict[str, torch.Tensor], dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The state dict as separate CPU tensors, floating ones in ``dtype`` when given. A tied
    head (``lm_head`` sharing the embedding, as SmolLM2 and small Qwen3 ship) is written out as
    its own copy: safetensors refuses shared storage, and vLLM 0.32's ``reload_weights`` leaves
    a tied head stale unless ``lm_head.weight`` is in the file (measured: 1.6 nats off without
    it, 2e-5 with it)."""
    seen: set[int] = set()
    out = {}
    state = model if isinstance(model, dict) else model.state_dict()
    for k, v in state.items():
        t = v.detach().to("cpu", copy=False)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        ptr = t.untyped_storage().data_ptr()
        out[k] = t.clone().contiguous() if ptr in seen else t.contiguous()
        seen.add(ptr)
    return out


def save_weights(
    model: torch.nn.Module | dict[str, torch.Tensor],
    directory: Path,
    dtype: torch.dtype | None = None,
) -> None:
    """``model.safetensors`` replaced atomically (vLLM must never read a half-written file)."""
    state = weights_state(model, dtype)
    durable.write_with(directory / "model.safetensors", lambda tmp: save_file(state, str(tmp)))


def parse_version(label: object) -> int | None:
    """vLLM's weight version label as floe's policy version: ``"default"`` is 0 (the base
    weights), a decimal label is its number, anything else (set by someone else) is unknown."""
    if label == BASE_VERSION_LABEL:
        return 0
    if isinstance(label, str) and label.isdigit():
        return int(label)
    return None


def served_label(vllm_url: str, timeout: float = 5) -> object:
    """vLLM's weight version label now (``/weight_info``)."""
    with urllib.request.urlopen(f"{vllm_url}/weight_info", timeout=timeout) as r:
        return json.loads(r.read()).get("weight_version")


def served_version(vllm_url: str, timeout: float = 5) -> int | None:
    """The policy version vLLM serves now; None if it cannot say."""
    return parse_version(served_label(vllm_url, timeout))


def resume(vllm_url: str) -> None:
    """Generation goes on (a vLLM not paused is unchanged)."""
    post(f"{vllm_url}/resume")


def paused(vllm_url: str, version: int, update: Callable[[], None]) -> None:
    """``update`` (the weights change) while generation is paused, then the version label.
    Generation always resumes (left paused, every agent's call would wait on a push that may
    never come: a restarted trainer, a finished one). A failure on the way may leave the new
    weights in already (a reload that failed part-way, or one whose label then failed): the
    prefix cache is reset all the same, so nothing computed with the old weights serves them;
    their old label lasts until the trainer's next served-version check pushes again."""
    post(f"{vllm_url}/pause?mode=wait")
    try:
        update()
        post(f"{vllm_url}/reset_prefix_cache")
        post(f"{vllm_url}/update_weight_version", {"new_version": str(version)})
    except BaseException:
        # The push's own failure is what is raised.
        with contextlib.suppress(OSError):
            post(f"{vllm_url}/reset_prefix_cache")
        raise
    finally:
        resume(vllm_url)


def push(
    weights: Weights,
    vllm_url: str,
    model_dir: Path,
    version: int,
    dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """The weights (``weights()``: the whole state dict) as policy ``version``, written in
    ``dtype`` ([push_dtype]). Returns seconds spent saving and in the server (paused time)."""
    t0 = time.monotonic()
    save_weights(weights(), model_dir, dtype)
    t1 = time.monotonic()
    paused(
        vllm_url,
        version,
        lambda: post(
            f"{vllm_url}/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}},
        ),
    )
    return {"save_seconds": t1 - t0, "paused_seconds": time.monotonic() - t1}


class FileWeightSync:
    """``push`` with the weights and where vLLM reloads from bound (the trainer's default).
    ``weights``: the whole state dict (a sharded trainer gathers it from its processes)."""

    def __init__(
        self, weights: Weights, vllm_url: str, model_dir: Path, dtype: torch.dtype | None = None
    ) -> None:
        self.weights, self.url, self.dir, self.dtype = weights, vllm_url, model_dir, dtype

    def push(self, version: int) -> dict[str, float]:
        return push(self.weights, self.url, self.dir, version, self.dtype)


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
