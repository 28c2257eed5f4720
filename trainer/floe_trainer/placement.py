"""Where and in which precision the trainer computes: ``device`` auto | cuda | cpu and
``precision`` auto | bf16 | fp32 (auto: bf16 on a GPU, fp32 on CPU). bf16 is mixed precision:
the weights and AdamW's state stay fp32 (the master copy vLLM receives) and the forward and
backward passes run under bf16 autocast."""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass

import torch

DEVICES = ("auto", "cuda", "cpu")
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class Placement:
    device: torch.device
    # None: plain fp32.
    autocast_dtype: torch.dtype | None

    @property
    def precision(self) -> str:
        return "bf16" if self.autocast_dtype == torch.bfloat16 else "fp32"

    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        # The fused CUDA kernel: one launch per step instead of several per parameter tensor.
        return torch.optim.AdamW(params, lr=lr, fused=self.device.type == "cuda")

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


CPU_FP32 = Placement(torch.device("cpu"), None)


def resolve(device: str = "auto", precision: str = "auto") -> Placement:
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: expected one of {', '.join(DEVICES)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device")
    dev = torch.device("cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu")
    if precision == "auto":
        precision = "bf16" if dev.type == "cuda" else "fp32"
    return Placement(dev, torch.bfloat16 if precision == "bf16" else None)


# glibc's mallopt parameter number for the mmap threshold (malloc.h: M_MMAP_THRESHOLD).
_M_MMAP_THRESHOLD = -3
# 4 MiB: activations (a few MiB and up) get their own mappings; the many small tensors stay on
# the heap (128 KiB measured ~8 % slower steps, and starved a 2-core machine's other work).
_CPU_MMAP_THRESHOLD = 4 * 1024 * 1024


def return_freed_memory_on_cpu(device: torch.device) -> bool:
    """On CPU, allocations of 4 MiB or more get their own mappings and go back to the system
    when freed. glibc otherwise raises that threshold as large blocks are freed (up to 32 MiB)
    and serves activations from its heap, where a step's freed tensors fragment it: a LoRA step
    of SmolLM2 over 3,072 tokens peaked at 8.6 GB of resident memory, 6.7 GB with the
    threshold fixed at 4 MiB (5.7 at 128 KiB, which cost ~8 % of step time). True when set."""
    if device.type != "cpu":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _CPU_MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False  # not glibc: its allocator keeps its own ways


def grow_gpu_memory_in_place(device: torch.device) -> bool:
    """On a GPU, the caching allocator maps its memory as segments it can grow
    (``expandable_segments``) instead of fixed blocks, so freed activations of one size are
    reused for the next pass's of another: on an H200, a Qwen3-1.7B step of two passes of
    2 × 4,096 tokens reserved 5.8 GiB beyond what it had allocated with fixed blocks, 3.9 with
    growable ones (docs/trainer.md): the reserve that runs a step out of memory near the
    plan's line. NCCL collectives on such memory were checked there too. A user's
    own ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` is left as it is. True when set."""
    if device.type != "cuda":
        return False
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        return False
    # Applies to the segments allocated from now on (the model has not loaded yet). torch
    # 2.11 calls this setter deprecated in favour of a private accelerator-wide one; this is
    # the one measured on the H200.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return True
