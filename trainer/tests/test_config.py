from pathlib import Path

import pytest

from floe_trainer.trainer import TrainerConfig


def test_the_operator_config_maps_to_the_trainer_config():
    c = TrainerConfig.from_operator(
        {
            "model": "/models/m",
            "numSamples": 8,
            "passThreshold": 0.5,
            "maxStaleness": 2,
            "grpo": {"learningRate": 3e-6, "advantage": "LeaveOneOut", "groupsPerStep": 4},
            "checkpoint": {"dir": "/checkpoints", "everySteps": 10, "keep": 2},
        },
        Path("/tmp/s"),
    )
    assert (c.num_samples, c.learning_rate, c.advantage, c.groups_per_step) == (
        8,
        3e-6,
        "LeaveOneOut",
        4,
    )
    assert (c.max_staleness, c.checkpoint_every, c.checkpoint_dir) == (2, 10, Path("/checkpoints"))


@pytest.mark.parametrize("grpo", [{"klCoef": 0.1}, {"gradientCheckpointing": True}])
def test_unsupported_options_are_refused_not_ignored(grpo):
    with pytest.raises(ValueError, match="not supported yet"):
        TrainerConfig.from_operator({"model": "m", "numSamples": 2, "grpo": grpo}, Path("/tmp"))
