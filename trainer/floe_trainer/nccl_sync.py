"""New weights into vLLM over NCCL, GPU to GPU, with no file round trip: vLLM's weight-transfer
API (vLLM 0.32, the trainer image's version; vLLM started with
``--weight-transfer-config '{"backend": "nccl"}'``).

Once, at start: the trainer (NCCL rank 0) and vLLM's workers (ranks 1..N) rendezvous on a
TCP store in the pod (``/init_weight_transfer_engine`` on vLLM's side). Each push:
``/pause`` → ``/start_weight_update`` → ``/update_weights`` (vLLM receives) while the trainer
broadcasts every parameter → ``/finish_weight_update`` → ``/reset_prefix_cache`` →
``/resume``. vLLM's own trainer-side engine drives the middle three; this module adds the
pause around them and the cast to the dtype vLLM serves (half the bytes of the fp32 master
weights for bf16).

Written against vLLM 0.32's sources. The CPU tests run vLLM's own engine and HTTP client with
only the NCCL rendezvous and broadcast replaced by a recorder (NCCL needs CUDA). Not yet run on
a GPU: see docs/trainer.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .vllm_sync import paused


@dataclass
class VllmWeightTransfer:
    """The vLLM classes this module drives, imported only when NCCL is chosen (the package
    imports without vLLM)."""

    init_info: Any  # NCCLTrainerInitInfo
    engine: Any  # NCCLTrainerWeightTransferEngine
    client: Any  # HTTPVLLMWeightSyncClient
    weight_source: Any  # WeightSource (abstract base)
    param_meta: Any  # ParamMeta


def load_vllm() -> VllmWeightTransfer:
    try:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )
    except ImportError as e:
        raise RuntimeError(
            "grpo.weightSync NCCL needs vLLM's weight-transfer API (vllm>=0.32) in the trainer "
            f"image: {e}"
        ) from e
    return VllmWeightTransfer(
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
        HTTPVLLMWeightSyncClient,
        WeightSource,
        ParamMeta,
    )


def served_source(vllm: VllmWeightTransfer, model: torch.nn.Module, dtype: torch.dtype) -> Any:
    """The model's parameters as vLLM loads them: cast to the served dtype. vLLM sizes its
    receive buffers from ``metadata()`` and reads bytes from iteration, so both must agree
    parameter for parameter. A tied head is sent under both names, as the File push writes
    it (``vllm_sync``): vLLM 0.32's reload leaves a tied ``lm_head`` stale unless it receives
    ``lm_head.weight`` itself (1.6 nats off measured on the File path without it)."""

    def named() -> Iterator[tuple[str, torch.nn.Parameter]]:
        return model.named_parameters(remove_duplicate=False)

    class ServedSource(vllm.weight_source):
        def metadata(self) -> list:
            return [vllm.param_meta(name, dtype, tuple(p.shape)) for name, p in named()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for name, p in named():
                yield name, p.detach().to(dtype).contiguous()

    return ServedSource()


class NcclWeightSync:
    def __init__(
        self,
        model: torch.nn.Module,
        vllm_url: str,
        *,
        master_port: int,
        vllm_world_size: int = 1,
        served_dtype: torch.dtype = torch.bfloat16,
        master_address: str = "127.0.0.1",
    ) -> None:
        self.url = vllm_url.rstrip("/")
        api = load_vllm()
        self.engine = api.engine.trainer_init(
            api.init_info(
                master_address=master_address,
                master_port=master_port,
                world_size=1 + vllm_world_size,
                rank=0,
            ),
            client=api.client(self.url),
            source=served_source(api, model, served_dtype),
        )

    def push(self, version: int) -> dict[str, float]:
        """Same keys as the file push: nothing is saved, all of it is paused time."""
        t0 = time.monotonic()
        paused(self.url, version, self.engine.send_weights)
        return {"save_seconds": 0.0, "paused_seconds": time.monotonic() - t0}
