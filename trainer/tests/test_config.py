from pathlib import Path

import pytest

from floe_trainer.trainer import TrainerConfig, loss_config


def test_the_operator_config_maps_to_the_trainer_config():
    c = TrainerConfig.from_operator(
        {
            "model": "/models/m",
            "numSamples": 8,
            "passThreshold": 0.5,
            "maxStaleness": 2,
            "grpo": {
                "learningRate": 3e-6,
                "advantage": "LeaveOneOut",
                "groupsPerStep": 4,
                "maxTokensPerMicroBatch": 32768,
            },
            "checkpoint": {"dir": "/checkpoints", "everySteps": 10, "keep": 2},
            "ingestDir": "/checkpoints/ingest",
            "maxSequenceTokens": 16384,
            "memoryPlan": "Warn",
        },
        Path("/tmp/s"),
    )
    assert c.ingest_dir == Path("/checkpoints/ingest")
    assert (c.max_tokens_per_micro_batch, c.max_sequence_tokens, c.memory_plan) == (
        32768,
        16384,
        "warn",
    )
    assert (c.num_samples, c.learning_rate, c.advantage, c.groups_per_step) == (
        8,
        3e-6,
        "LeaveOneOut",
        4,
    )
    assert (c.max_staleness, c.checkpoint_every, c.checkpoint_dir) == (2, 10, Path("/checkpoints"))


def test_gpu_options_map_through():
    c = TrainerConfig.from_operator(
        {
            "model": "m",
            "numSamples": 2,
            "grpo": {"klCoef": 0.05, "gradientCheckpointing": True, "precision": "BF16"},
        },
        Path("/tmp"),
    )
    assert (c.kl_coef, c.gradient_checkpointing, c.precision) == (0.05, True, "bf16")


@pytest.mark.parametrize("gpus, device", [(None, "auto"), (0, "cpu"), (1, "cuda")])
def test_train_gpus_picks_the_device(gpus, device):
    c = {"model": "m", "numSamples": 2} | ({} if gpus is None else {"gpus": gpus})
    assert TrainerConfig.from_operator(c, Path("/tmp")).device == device


def test_training_gpus_need_as_many_processes_never_fewer():
    from floe_trainer.trainer import check_processes

    c = TrainerConfig.from_operator({"model": "m", "numSamples": 2, "gpus": 4}, Path("/tmp"))
    assert (c.device, c.gpus) == ("cuda", 4)
    check_processes(c, 4)
    with pytest.raises(ValueError, match="train.gpus is 4 and train.nodes 1 but 1 trainer"):
        check_processes(c, 1)
    cpu = TrainerConfig.from_operator({"model": "m", "numSamples": 2, "gpus": 0}, Path("/tmp"))
    check_processes(cpu, 2)  # CPU training on one machine: any number (the tests run two)
    # Several nodes: each node's processes, all of them.
    nodes = TrainerConfig.from_operator(
        {"model": "m", "numSamples": 2, "gpus": 8, "nodes": 2}, Path("/tmp")
    )
    check_processes(nodes, 16)
    with pytest.raises(ValueError, match="start 16"):
        check_processes(nodes, 8)
    cpu_nodes = TrainerConfig.from_operator(
        {"model": "m", "numSamples": 2, "gpus": 0, "nodes": 2}, Path("/tmp")
    )
    check_processes(cpu_nodes, 2)
    with pytest.raises(ValueError, match="start 2"):
        check_processes(cpu_nodes, 1)
    # A LoRA adapter trains over several nodes (sharded like full training); NCCL sync does not.
    lora_nodes = TrainerConfig.from_operator(
        {"model": "m", "numSamples": 2, "gpus": 2, "nodes": 2, "lora": {"rank": 8}}, Path("/tmp")
    )
    check_processes(lora_nodes, 4)
    for refused, why in [
        ({"grpo": {"weightSync": "NCCL"}, "gpus": 1}, "one training process"),
    ]:
        with pytest.raises(ValueError, match=why):
            TrainerConfig.from_operator(
                {"model": "m", "numSamples": 2, "nodes": 2} | refused, Path("/tmp")
            )
    with pytest.raises(ValueError, match="NCCL is for one training GPU"):
        TrainerConfig.from_operator(
            {"model": "m", "numSamples": 2, "gpus": 2, "grpo": {"weightSync": "NCCL"}},
            Path("/tmp"),
        )
    with pytest.raises(ValueError, match="dualClip must be above 1"):
        TrainerConfig.from_operator(
            {"model": "m", "numSamples": 2, "grpo": {"dualClip": 1.0}}, Path("/tmp")
        )


def test_a_negative_kl_coefficient_is_refused():
    with pytest.raises(ValueError, match="klCoef"):
        TrainerConfig.from_operator(
            {"model": "m", "numSamples": 2, "grpo": {"klCoef": -1}}, Path("/tmp")
        )


def test_overlong_sessions_are_trained_unless_the_job_masks_them():
    def overlong(grpo):
        return TrainerConfig.from_operator(
            {"model": "m", "numSamples": 2, "grpo": grpo}, Path("/tmp")
        ).overlong

    assert (overlong({}), overlong({"overlong": "Mask"})) == ("train", "mask")
    with pytest.raises(ValueError, match="grpo.overlong must be Train or Mask"):
        overlong({"overlong": "Drop"})


def test_placement_resolves_and_refuses_unknown_values():
    from floe_trainer.placement import resolve

    p = resolve("cpu", "auto")
    assert (p.device.type, p.precision) == ("cpu", "fp32")
    assert resolve("cpu", "bf16").precision == "bf16"
    with pytest.raises(ValueError, match="precision"):
        resolve("cpu", "fp8")
    with pytest.raises(ValueError, match="device"):
        resolve("tpu", "auto")


def test_gpu_memory_grows_in_place_unless_the_user_configured_the_allocator(monkeypatch):
    import torch

    from floe_trainer.placement import grow_gpu_memory_in_place

    asked: list[str] = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", asked.append)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    assert not grow_gpu_memory_in_place(torch.device("cpu"))
    assert grow_gpu_memory_in_place(torch.device("cuda")) and asked == ["expandable_segments:True"]
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.setenv(var, "max_split_size_mb:512")
        assert not grow_gpu_memory_in_place(torch.device("cuda"))
        monkeypatch.delenv(var)
    assert asked == ["expandable_segments:True"]


def test_the_sampling_temperature_is_the_trained_policys_and_greedy_is_refused():
    cfg = TrainerConfig.from_operator(
        {"model": "m", "numSamples": 2, "temperature": 0.7}, Path("/t")
    )
    assert cfg.temperature == 0.7
    assert loss_config(cfg).temperature == 0.7
    with pytest.raises(ValueError, match="temperature"):
        TrainerConfig.from_operator({"model": "m", "numSamples": 2, "temperature": 0}, Path("/t"))
