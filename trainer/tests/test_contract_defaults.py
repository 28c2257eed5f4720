"""The trainer's defaults are the RolloutJob CRD's: a key missing from FLOE_TRAINER_CONFIG
means the same thing to the trainer as a field left out of the job does to the operator."""

from pathlib import Path

import yaml

from floe_trainer.trainer import TrainerConfig

CRDS = Path(__file__).resolve().parents[2] / "charts/floe/files/crds/floe-crds.yaml"

# CRD field (under spec.train) -> TrainerConfig attribute, and how the trainer spells the value.
GRPO = {
    "learningRate": ("learning_rate", float),
    "advantage": ("advantage", str),
    "epsilonLow": ("epsilon_low", float),
    "epsilonHigh": ("epsilon_high", float),
    "dualClip": ("dual_clip", float),
    "tisCap": ("tis_cap", float),
    "lossAggregation": ("loss_aggregation", str),
    "groupsPerStep": ("groups_per_step", int),
    "microBatchSize": ("micro_batch_size", int),
    "maxTokensPerMicroBatch": ("max_tokens_per_micro_batch", int),
    "maxGradNorm": ("max_grad_norm", float),
    "minGroupFraction": ("min_group_fraction", float),
    "groupGraceSeconds": ("group_grace_seconds", float),
    "precision": ("precision", lambda v: str(v).lower()),
    "gradientCheckpointing": ("gradient_checkpointing", bool),
    "klCoef": ("kl_coef", float),
    "overlong": ("overlong", lambda v: str(v).lower()),
    "weightSync": ("weight_sync", lambda v: str(v).lower()),
    "miniBatches": ("mini_batches", int),
    "ppoEpochs": ("ppo_epochs", int),
    # An object, unset by default: its buffer is then unset in the trainer (no penalty).
    "overlongPenalty": ("overlong_buffer", int),
}


def spec_schema() -> dict:
    for doc in yaml.safe_load_all(CRDS.read_text()):
        if doc and doc["spec"]["names"]["kind"] == "RolloutJob":
            spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            return spec["properties"]
    raise AssertionError(f"no RolloutJob CRD in {CRDS}")


def train_schema() -> dict:
    return spec_schema()["train"]["properties"]


def test_every_grpo_default_of_the_crd_is_the_trainers():
    grpo = train_schema()["grpo"]["properties"]
    assert set(grpo) == set(GRPO), "a grpo field the trainer does not read, or one it lost"
    left_out = TrainerConfig.from_operator({"model": "m", "numSamples": 2}, Path("/tmp"))
    for field, (attr, spell) in GRPO.items():
        if "default" not in grpo[field]:
            assert getattr(left_out, attr) is None, f"{field}: unset in the CRD, so in the trainer"
            continue
        assert getattr(left_out, attr) == spell(grpo[field]["default"]), field


def test_the_overlong_penalty_factor_defaults_alike():
    penalty = train_schema()["grpo"]["properties"]["overlongPenalty"]["properties"]
    conf = {"model": "m", "numSamples": 2, "maxResponseTokens": 16}
    conf["grpo"] = {"overlongPenalty": {"bufferTokens": 4}}
    told = TrainerConfig.from_operator(conf, Path("/tmp"))
    assert (told.overlong_buffer, told.overlong_factor) == (4, penalty["factor"]["default"])


def test_the_other_train_defaults_match_too():
    train = train_schema()
    left_out = TrainerConfig.from_operator({"model": "m", "numSamples": 2}, Path("/tmp"))
    assert left_out.max_staleness == train["maxStaleness"]["default"]
    assert left_out.memory_plan == train["memoryPlan"]["default"].lower()
    assert left_out.vllm_gpus == train["vllm"]["default"]["gpus"]
    checkpoint = train["checkpoint"]["properties"]
    assert left_out.checkpoint_every == checkpoint["everySteps"]["default"]
    assert left_out.checkpoint_keep == checkpoint["keep"]["default"]


def test_the_reward_defaults_match():
    reward = spec_schema()["evaluator"]["properties"]["reward"]["properties"]
    left_out = TrainerConfig.from_operator({"model": "m", "numSamples": 2}, Path("/tmp"))
    assert left_out.pass_threshold == reward["passThreshold"]["default"]
    assert left_out.failure_reward == reward["failureReward"]["default"]


def test_the_lora_defaults_match():
    from floe_trainer.lora import LoraSpec

    lora = train_schema()["lora"]["properties"]
    spec = LoraSpec.from_operator({})
    assert spec.rank == lora["rank"]["default"]
    assert spec.merge_final == lora["mergeFinal"]["default"]
    assert spec.alpha == 2 * spec.rank and "default" not in lora["alpha"]
