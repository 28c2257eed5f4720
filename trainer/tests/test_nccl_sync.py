"""The NCCL weight push against vLLM 0.32's own trainer-side engine and HTTP client, with only
the NCCL transport replaced (it needs CUDA): the control calls go over real HTTP to a
recording server shaped like vLLM's RL routes, and the recorder takes the tensors the engine
would have broadcast."""

from __future__ import annotations

import types

import pytest
import torch
from fake_vllm import FakeVllm

from floe_trainer.trainer import Trainer, TrainerConfig

nccl_engine = pytest.importorskip("vllm.distributed.weight_transfer.nccl_engine")

from floe_trainer import nccl_sync  # noqa: E402


class TiedLM(torch.nn.Module):
    """Input and output embeddings share one tensor, as in SmolLM2."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.mlp = torch.nn.Linear(4, 4)
        self.lm_head = torch.nn.Linear(4, 11, bias=False)
        self.lm_head.weight = self.embed.weight


@pytest.fixture
def transport(monkeypatch):
    """vLLM's engine minus NCCL: the rendezvous returns a dummy group, the broadcast records."""
    sent: dict = {"endpoint": None, "rounds": []}

    def endpoint(info):
        sent["endpoint"] = info
        return object()

    def broadcast(self, source, meta):
        sent["rounds"].append((meta, list(source)))

    monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", endpoint)
    monkeypatch.setattr(nccl_engine.NCCLTrainerWeightTransferEngine, "_broadcast", broadcast)
    monkeypatch.setattr(
        nccl_engine.NCCLTrainerWeightTransferEngine, "_post_send_sync", lambda self: None
    )
    return sent


def test_rendezvous_then_each_push_pauses_sends_and_resumes(transport):
    vllm = FakeVllm()
    try:
        model = TiedLM()
        sync = nccl_sync.NcclWeightSync(model, vllm.url, master_port=29551, vllm_world_size=2)
        # Rendezvous: vLLM's workers are told ranks 1.. of a group of 1 trainer + 2 workers.
        assert vllm.paths() == ["/init_weight_transfer_engine"]
        init = vllm.calls[0][1]["init_info"]
        assert (init["rank_offset"], init["world_size"], init["master_port"]) == (1, 3, 29551)
        assert transport["endpoint"].world_size == 3 and transport["endpoint"].rank == 0

        with torch.no_grad():
            model.mlp.weight.add_(1.0)
        timing = sync.push(1)
        assert vllm.paths()[1:] == [
            "/pause?mode=wait",
            "/start_weight_update",
            "/update_weights",
            "/finish_weight_update",
            "/reset_prefix_cache",
            "/update_weight_version",
            "/resume",
        ]
        assert vllm.calls[-2][1] == {"new_version": "1"}
        assert timing["save_seconds"] == 0.0 and timing["paused_seconds"] >= 0.0
        # What vLLM is told to receive is what the trainer sends: bf16, the tied tensor under
        # both its names (vLLM's reload leaves a tied head stale unless it gets lm_head too).
        update = vllm.calls[3][1]["update_info"]
        assert update["names"] == ["embed.weight", "mlp.weight", "mlp.bias", "lm_head.weight"]
        assert set(update["dtype_names"]) == {"bfloat16"}
        assert update["shapes"] == [[11, 4], [4, 4], [4], [11, 4]]
        meta, tensors = transport["rounds"][0]
        assert [m.name for m in meta] == [n for n, _ in tensors] == update["names"]
        sent = dict(tensors)
        assert all(t.dtype == torch.bfloat16 for t in sent.values())
        assert torch.equal(sent["mlp.weight"], model.mlp.weight.detach().to(torch.bfloat16))
        assert torch.equal(sent["lm_head.weight"], sent["embed.weight"])
    finally:
        vllm.close()


def test_a_failed_update_still_resets_the_cache_resumes_generation_and_raises(transport):
    # Half the weights may be in: no prefix cache of the old ones may serve them.
    vllm = FakeVllm(fail_on="/finish_weight_update")
    try:
        sync = nccl_sync.NcclWeightSync(TiedLM(), vllm.url, master_port=29551)
        with pytest.raises(Exception, match="500"):
            sync.push(1)
        assert vllm.paths()[-2:] == ["/reset_prefix_cache", "/resume"]
        assert vllm.label == "default"
    finally:
        vllm.close()


def config(**grpo):
    return {"model": "m", "numSamples": 2, "gpus": 1, "vllmGpus": 2, "grpo": grpo}


def test_weight_sync_is_chosen_in_the_job_and_checked(tmp_path):
    assert TrainerConfig.from_operator(config(), tmp_path).weight_sync == "file"
    c = TrainerConfig.from_operator(config(weightSync="NCCL"), tmp_path)
    assert (c.weight_sync, c.vllm_gpus) == ("nccl", 2)
    with pytest.raises(ValueError, match="File or NCCL"):
        TrainerConfig.from_operator(config(weightSync="Carrier pigeon"), tmp_path)
    cpu = {**config(weightSync="NCCL"), "gpus": 0}
    with pytest.raises(ValueError, match="train.gpus 1"):
        TrainerConfig.from_operator(cpu, tmp_path)


def test_the_nccl_push_sends_in_the_dtype_vllm_serves(transport, tmp_path):
    """A job whose vLLM keeps fp32 (``--dtype float32``, passed as ``servingDtype``) is sent
    fp32: bf16 buffers would round every push; without a ``--dtype``, bf16."""
    vllm = FakeVllm()
    try:
        for serving, sent in (("float32", "float32"), ("float16", "float16"), (None, "bfloat16")):
            conf = {**config(weightSync="NCCL"), "policyUrl": vllm.url}
            if serving:
                conf["servingDtype"] = serving
            cfg = TrainerConfig.from_operator(conf, tmp_path)
            sync = Trainer._weight_sync(types.SimpleNamespace(cfg=cfg, model=TiedLM()))
            sync.push(1)
            update = [b for p, b in vllm.calls if p == "/update_weights"][-1]["update_info"]
            assert set(update["dtype_names"]) == {sent}, serving
            _, tensors = transport["rounds"][-1]
            assert {t.dtype for _, t in tensors} == {getattr(torch, sent)}
    finally:
        vllm.close()
