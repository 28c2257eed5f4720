"""The trainer loop: trajectories arrive (ingest), groups become ready (batching), every
``groups_per_step`` ready groups make one GRPO step, the new weights go to vLLM and the
policy version goes up; checkpoints every ``every_steps``. A restart resumes from the latest
checkpoint (model, optimizer, step, policy version, pushed back into vLLM) and replays every
acknowledged trajectory not trained before that checkpoint. A vLLM that restarted (it serves
the base weights again, labelled ``default``) gets the current weights pushed again.

``finish()`` says no more trajectories are coming: the groups still pending are trained as
they are (fewer than ``groups_per_step`` make a last, smaller step), every group that cannot
be trained is counted, and a final checkpoint with the tokenizer goes to ``final_dir``: a
model directory vLLM serves as the next job's model."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import logging
import queue
import shutil
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from . import checkpoint, durable, fidelity, lora, memory_plan
from .advantages import overlong_penalty
from .batching import Group, GroupBuffer
from .distributed import (
    HEARTBEAT_SECONDS,
    SINGLE,
    World,
    agree,
    broadcast_weights,
    full_optimizer_state,
    full_state_dict,
    load_optimizer_state,
    shard,
    tell,
)
from .ingest import Ingest, Store
from .lora import LoraSpec
from .loss import LossConfig
from .metrics import Metrics
from .nccl_sync import NcclWeightSync
from .placement import Placement, grow_gpu_memory_in_place, resolve, return_freed_memory_on_cpu
from .policy import without_dropout
from .step import StepStats, train_step
from .vllm_sync import (
    BASE_VERSION_LABEL,
    FileWeightSync,
    parse_version,
    push_dtype,
    resume,
    served_label,
    wait_healthy,
)
from .wire import Trajectory

log = logging.getLogger("floe_trainer")


def push_failure_passes(e: OSError) -> bool:
    """Whether a push that failed so is worth another later: vLLM unreachable, or answering a
    5xx, 408 or 429. Any other 4xx is a policy server that does not take pushes as sent (a
    route or a flag missing): the same every time, so the trainer stops saying so."""
    if isinstance(e, urllib.error.HTTPError):
        return e.code >= 500 or e.code in (408, 429)
    return True


@dataclass
class TrainerConfig:
    model: str
    policy_url: str
    state_dir: Path
    num_samples: int
    pass_threshold: float = 1.0
    # ``evaluator.reward.failureReward``: what a session failed by the agent's own doing scores.
    failure_reward: float = 0.0
    learning_rate: float = 1e-6
    advantage: str = "MeanStd"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    dual_clip: float = 3.0
    tis_cap: float = 2.0
    loss_aggregation: str = "TokenMean"
    groups_per_step: int = 8
    micro_batch_size: int = 4
    # Tokens a forward/backward pass may hold (traces packed by length); None: a count only.
    max_tokens_per_micro_batch: int | None = None
    max_grad_norm: float = 1.0
    min_group_fraction: float = 1.0
    group_grace_seconds: float = 300.0
    max_staleness: int = 1
    checkpoint_every: int = 50
    checkpoint_keep: int = 3
    checkpoint_dir: Path | None = None
    # The job (its name and the uid of this run of it) whose state the checkpoints hold.
    job: str | None = None
    job_uid: str | None = None
    device: str = "auto"
    precision: str = "auto"
    gradient_checkpointing: bool = False
    kl_coef: float = 0.0
    # ``grpo.overlong``: "mask" keeps the loss of a session with a call cut at its token cap
    # out of the step (its reward stays in its group's baseline); "train" trains it.
    overlong: str = "train"
    # ``grpo.overlongPenalty``: DAPO's soft overlong punishment, the buffer before
    # ``max_response_tokens`` (None: off) and the penalty at the cap.
    overlong_buffer: int | None = None
    overlong_factor: float = 1.0
    # ``sampling.temperature``: the policy trained is the tempered one vLLM samples from.
    temperature: float = 1.0
    # ``sampling.maxResponseTokens``: TokenSumNorm's constant (Dr. GRPO's), so no length is
    # favoured; unset, 1024.
    max_response_tokens: int | None = None
    # How new weights reach vLLM: "file" (safetensors + reload) or "nccl" (GPU broadcast).
    weight_sync: str = "file"
    nccl_port: int = 29551
    vllm_gpus: int = 1
    # Optimizer updates per rollout batch: ``ppo_epochs`` passes of ``mini_batches`` each.
    mini_batches: int = 1
    ppo_epochs: int = 1
    # The final checkpoint (default: ``<checkpoints>/final``).
    final_dir: Path | None = None
    # Every acknowledged trajectory (default: ``<state>/ingest``); the operator puts it on the
    # checkpoint claim, so a lost trainer pod loses none.
    ingest_dir: Path | None = None
    # How often the loop asks vLLM which weights it serves (a restarted vLLM is re-pushed).
    served_check_seconds: float = 5.0
    # The longest trace a step may see: vLLM's context length (default: the model's).
    max_sequence_tokens: int | None = None
    # vLLM's ``--dtype`` in torch's name (``bfloat16``, ``float16``, ``float32``); None: auto.
    serving_dtype: str | None = None
    # Training GPUs (``train.gpus``): one process each; None when the config does not say.
    gpus: int | None = None
    # Trainer pods (``train.nodes``), each with ``gpus`` processes (one on CPU), one world.
    nodes: int = 1
    # "enforce": a step that cannot fit the device is refused before the model loads;
    # "warn": logged, and the trainer starts anyway.
    memory_plan: str = "enforce"
    # ``train.lora``: train an adapter only (``lora``); None trains every weight.
    lora: LoraSpec | None = None

    @staticmethod
    def from_operator(c: dict, state_dir: Path) -> TrainerConfig:
        """The JSON the operator puts in ``FLOE_TRAINER_CONFIG`` (docs/trainer.md).

        A key the config leaves out keeps this class's default; the operator and ``floe run``
        write every field with the CRD's defaults filled, and a test holds the two equal
        (``tests/test_contract_defaults.py``)."""
        g = c.get("grpo") or {}
        ck = c.get("checkpoint") or {}
        given: dict = {}

        def take(field: str, source: dict, key: str, convert) -> None:
            if source.get(key) is not None:
                given[field] = convert(source[key])

        take("job", c, "job", str)
        take("job_uid", c, "jobUid", str)
        take("policy_url", c, "policyUrl", str)
        take("pass_threshold", c, "passThreshold", float)
        take("failure_reward", c, "failureReward", float)
        take("max_staleness", c, "maxStaleness", int)
        take("vllm_gpus", c, "vllmGpus", int)
        take("nodes", c, "nodes", int)
        take("final_dir", c, "finalDir", Path)
        take("ingest_dir", c, "ingestDir", Path)
        take("max_sequence_tokens", c, "maxSequenceTokens", int)
        take("serving_dtype", c, "servingDtype", str)
        take("temperature", c, "temperature", float)
        take("max_response_tokens", c, "maxResponseTokens", int)
        take("memory_plan", c, "memoryPlan", lambda v: str(v).lower())
        take("lora", c, "lora", LoraSpec.from_operator)
        for field, key, convert in [
            ("learning_rate", "learningRate", float),
            ("advantage", "advantage", str),
            ("epsilon_low", "epsilonLow", float),
            ("epsilon_high", "epsilonHigh", float),
            ("dual_clip", "dualClip", float),
            ("tis_cap", "tisCap", float),
            ("loss_aggregation", "lossAggregation", str),
            ("groups_per_step", "groupsPerStep", int),
            ("micro_batch_size", "microBatchSize", int),
            ("max_tokens_per_micro_batch", "maxTokensPerMicroBatch", int),
            ("max_grad_norm", "maxGradNorm", float),
            ("min_group_fraction", "minGroupFraction", float),
            ("group_grace_seconds", "groupGraceSeconds", float),
            ("precision", "precision", lambda v: str(v).lower()),
            ("gradient_checkpointing", "gradientCheckpointing", bool),
            ("kl_coef", "klCoef", float),
            ("overlong", "overlong", lambda v: str(v).lower()),
            ("weight_sync", "weightSync", lambda v: str(v).lower()),
            ("mini_batches", "miniBatches", int),
            ("ppo_epochs", "ppoEpochs", int),
        ]:
            take(field, g, key, convert)
        penalty = g.get("overlongPenalty")
        if penalty is not None:
            take("overlong_buffer", penalty, "bufferTokens", int)
            take("overlong_factor", penalty, "factor", float)
        take("checkpoint_every", ck, "everySteps", int)
        take("checkpoint_keep", ck, "keep", int)
        take("checkpoint_dir", ck, "dir", Path)
        if given.get("temperature", 1.0) <= 0:
            raise ValueError(
                f"sampling.temperature must be > 0 to train, got {given['temperature']}: "
                "greedy tokens have no sampling distribution to weigh"
            )
        if given.get("kl_coef", 0.0) < 0:
            raise ValueError(f"grpo.klCoef must be >= 0, got {given['kl_coef']}")
        if given.get("dual_clip", TrainerConfig.dual_clip) <= 1:
            raise ValueError(f"grpo.dualClip must be above 1, got {given['dual_clip']}")
        # train.gpus: 0 trains on CPU, 1 on the pod's GPU, more on that many processes under
        # torchrun (``processes``: checked against the processes started, never ignored).
        gpus = c.get("gpus")
        if gpus is not None:
            given["device"] = "cpu" if int(gpus) == 0 else "cuda"
            given["gpus"] = int(gpus)
        buffer = given.get("overlong_buffer")
        if buffer is not None:
            cap = given.get("max_response_tokens")
            if buffer < 1 or cap is None or buffer > cap:
                raise ValueError(
                    f"grpo.overlongPenalty.bufferTokens must be 1..maxResponseTokens ({cap}), "
                    f"got {buffer}"
                )
            if given.get("overlong_factor", 1.0) < 0:
                raise ValueError(
                    f"grpo.overlongPenalty.factor must be >= 0, got {given['overlong_factor']}"
                )
        if given.get("overlong", "train") not in ("train", "mask"):
            raise ValueError(f"grpo.overlong must be Train or Mask, got {g['overlong']!r}")
        if given.get("memory_plan", "enforce") not in memory_plan.MODES:
            raise ValueError(f"memoryPlan must be Enforce or Warn, got {c['memoryPlan']!r}")
        weight_sync = given.get("weight_sync", TrainerConfig.weight_sync)
        if weight_sync not in ("file", "nccl"):
            raise ValueError(f"grpo.weightSync must be File or NCCL, got {weight_sync!r}")
        if weight_sync == "nccl" and given.get("nodes", 1) > 1:
            raise ValueError("grpo.weightSync NCCL is for one training process; use File")
        if given.get("lora") and weight_sync == "nccl":
            raise ValueError("train.lora pushes the adapter as a file: set grpo.weightSync File")
        if weight_sync == "nccl" and given.get("gpus", 1) > 1:
            raise ValueError("grpo.weightSync NCCL is for one training GPU; use File")
        if weight_sync == "nccl" and given.get("device", TrainerConfig.device) != "cuda":
            raise ValueError(
                "grpo.weightSync NCCL broadcasts from the trainer's GPU: set train.gpus 1"
            )
        return TrainerConfig(
            model=c["model"],
            policy_url=given.pop("policy_url", "http://127.0.0.1:8000"),
            state_dir=state_dir,
            num_samples=int(c["numSamples"]),
            **given,
        )


def expected_processes(cfg: TrainerConfig) -> int | None:
    """The trainer processes ``cfg`` trains with: one per GPU on each of ``train.nodes`` pods
    (one per pod on CPU); None where any number will do (CPU on one machine: the tests run
    two)."""
    if cfg.gpus is None or (cfg.gpus == 0 and cfg.nodes <= 1):
        return None
    return max(cfg.gpus, 1) * cfg.nodes


def check_processes(cfg: TrainerConfig, started: int) -> None:
    """``train.gpus`` GPUs on each of ``train.nodes`` pods are trained on by as many
    processes: a trainer started otherwise is refused rather than training on fewer GPUs than
    the job has."""
    expected = expected_processes(cfg)
    if expected is not None and started != expected:
        raise ValueError(
            f"train.gpus is {cfg.gpus} and train.nodes {cfg.nodes} but {started} trainer "
            f"process(es) started: start {expected}, torchrun --nproc-per-node="
            f"{max(cfg.gpus or 1, 1)} on each node -m floe_trainer.cli serve "
            "(the operator and floe run do)"
        )


def review_memory(cfg: TrainerConfig, model_dir: Path, processes: int = 1) -> dict | None:
    """The memory plan of ``cfg``'s training step (``memory_plan.review``), as ``/v1/status``
    reports it."""
    placement = resolve(cfg.device, cfg.precision)
    lora = (cfg.lora.rank, cfg.lora.targets) if cfg.lora else None
    reviewed = memory_plan.review(
        Path(cfg.model) if cfg.lora else model_dir,
        placement.device.type,
        placement.precision,
        cfg.max_sequence_tokens,
        cfg.micro_batch_size,
        cfg.gradient_checkpointing,
        cfg.kl_coef > 0,
        cfg.memory_plan,
        cfg.max_tokens_per_micro_batch,
        processes,
        lora,
    )
    if reviewed is None:
        return None
    plan, have = reviewed
    return {**plan.as_json(), "capacityBytes": have}


@dataclass
class Policy:
    """What every process of a trainer holds: the model (sharded over the processes when
    several), its optimizer, the KL reference and where they compute."""

    placement: Placement
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | None
    memory_plan: dict | None


def load_policy(cfg: TrainerConfig, world: World, resume: Path | None) -> Policy:
    placement = resolve(cfg.device, cfg.precision)
    dev = placement.device
    return_freed_memory_on_cpu(dev)
    grow_gpu_memory_in_place(dev)
    # Before the model loads: a step that cannot fit is refused in one line, not an OOM
    # minutes (or a first long trace) later.
    # A sharded world resumes from the leader's checkpoint alone: the other processes start
    # from the base model and take the checkpoint's weights from the leader (on another node
    # they cannot see its checkpoint volume).
    own_resume = resume if world.leader else None
    plan = review_memory(cfg, Path(own_resume or cfg.model), world.size)
    if cfg.lora:
        # The frozen base in the precision it computes in; the adapter (fp32) from the
        # checkpoint when resuming (a LoRA checkpoint holds only the adapter).
        dtype = placement.autocast_dtype or torch.float32
        base = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).to(dev)
        model = lora.wrap(base, cfg.lora, own_resume)
        # Every process trains the leader's adapter: a fresh one is drawn at random on each.
        broadcast_weights(model, world, trainable_only=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(own_resume or cfg.model, dtype=torch.float32)
        model.to(dev)
        if resume:
            broadcast_weights(model, world)
    if dropped := without_dropout(model):
        log.info("dropout set to 0 in %d places (vLLM samples without it)", len(dropped))
    if cfg.gradient_checkpointing:
        # Activations recomputed in the backward pass: memory for time, on long traces.
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
        if cfg.lora:
            # The frozen embeddings' output needs a gradient for the checkpointed layers'
            # adapters to get theirs.
            model.enable_input_require_grads()
    model = shard(model, world, dev.type)
    # The reference for the KL term is the policy the job started from, never a checkpoint.
    # With LoRA that is the base itself, the adapter off (``step.reference_logprobs``): no
    # second copy of the model.
    reference = None
    if cfg.kl_coef > 0 and not cfg.lora:
        ref_dtype = placement.autocast_dtype or torch.float32
        reference = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=ref_dtype)
        reference.to(dev).eval().requires_grad_(False)
    optimizer = placement.optimizer(lora.trainable(model), cfg.learning_rate)
    if agree(world, bool(own_resume and (own_resume / "optimizer.pt").exists())):
        saved = torch.load(own_resume / "optimizer.pt", map_location=dev) if own_resume else {}
        load_optimizer_state(model, optimizer, saved, world)
        # The restored state carries the learning rate it was saved with: the job's own
        # (changed before a resume, say) is the one that trains, not silently the old one.
        for group in optimizer.param_groups:
            if group["lr"] != cfg.learning_rate:
                log.info(
                    "learning rate %g (the checkpoint's was %g)", cfg.learning_rate, group["lr"]
                )
                group["lr"] = cfg.learning_rate
    return Policy(placement, model, optimizer, reference, plan)


def loss_config(cfg: TrainerConfig) -> LossConfig:
    return LossConfig(
        epsilon_low=cfg.epsilon_low,
        epsilon_high=cfg.epsilon_high,
        dual_clip=cfg.dual_clip,
        tis_cap=cfg.tis_cap,
        aggregation=cfg.loss_aggregation,
        kl_coef=cfg.kl_coef,
        temperature=cfg.temperature,
        sum_norm=float(cfg.max_response_tokens or LossConfig.sum_norm),
    )


def step_options(cfg: TrainerConfig) -> dict:
    """``train_step``'s settings from ``cfg`` (the same on every process)."""
    return {
        "micro_batch_size": cfg.micro_batch_size,
        "max_grad_norm": cfg.max_grad_norm,
        "mini_batches": cfg.mini_batches,
        "epochs": cfg.ppo_epochs,
        "max_tokens_per_micro_batch": cfg.max_tokens_per_micro_batch,
    }


def follow(cfg: TrainerConfig, world: World) -> int:
    """A process other than the leader: the same policy, sharded; then, until told to stop,
    the steps, weight gathers and checkpoints the leader says, in its order."""
    ckpt_dir = cfg.checkpoint_dir or cfg.state_dir / "checkpoints"
    resume = agree(world, checkpoint.latest(ckpt_dir))
    policy = load_policy(cfg, world, resume)
    loss_cfg = loss_config(cfg)
    while True:
        command = agree(world, None)
        what = command[0]
        if what == "step":
            _, groups, seed = command
            train_step(
                policy.model,
                policy.optimizer,
                groups,
                loss_cfg,
                placement=policy.placement,
                reference=policy.reference,
                seed=seed,
                world=world,
                **step_options(cfg),
            )
        elif what == "fidelity":
            fidelity.compare(policy.model, command[1], policy.placement, loss_cfg.temperature)
        elif what == "weights":
            full_state_dict(policy.model, world)
        elif what == "adapter":
            full_state_dict(policy.model, world, trainable_only=True)
        elif what == "checkpoint":
            full_state_dict(policy.model, world, trainable_only=bool(cfg.lora))
            full_optimizer_state(policy.model, policy.optimizer, world)
        elif what == "stop":
            return 0
        elif what == "noop":
            continue
        else:
            raise ValueError(f"unknown command from the leader: {what!r}")


PUSHED_VERSION_FILE = "pushed-version"

# A merged final model that lost more than this share of the adapter's change is said loudly.
MERGE_ROUNDING_WARN = 0.05


def read_pushed_version(directory: Path) -> int | None:
    try:
        return int((directory / PUSHED_VERSION_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def record_pushed_version(directory: Path, version: int) -> None:
    """The highest version ever pushed, kept across restarts, durably."""
    if (read_pushed_version(directory) or 0) >= version:
        return
    durable.write_bytes(directory / PUSHED_VERSION_FILE, str(version).encode())


def overlong_penalty_of(cfg: TrainerConfig) -> Callable[[Trajectory], float] | None:
    """A session's ``grpo.overlongPenalty``, or None when the job sets none."""
    if cfg.overlong_buffer is None:
        return None
    cap, buffer, factor = cfg.max_response_tokens, cfg.overlong_buffer, cfg.overlong_factor
    return lambda t: overlong_penalty(t.longest_turn_tokens, cap, buffer, factor)


class Trainer:
    def __init__(self, cfg: TrainerConfig, world: World = SINGLE) -> None:
        self.cfg = cfg
        self.metrics = Metrics()
        self.lock = threading.Lock()
        # One failed sample's ruling at a time (a repeat must find the first one's result).
        self.ruling_lock = threading.Lock()
        # Held while a step trains and pushes, and while the fidelity check reads the model.
        self.model_lock = threading.Lock()
        # Fidelity checks of a trainer of several processes, for the loop's thread to serve:
        # every process takes part in the forward, in the order the leader tells them.
        self.fidelity_requests: queue.Queue[tuple[list, Future]] = queue.Queue()
        self.ckpt_dir = cfg.checkpoint_dir or cfg.state_dir / "checkpoints"
        # vLLM reloads from here (the model volume is read-only in the pod).
        self.weights_dir = cfg.state_dir / "weights"
        self.buffer = GroupBuffer(
            cfg.num_samples,
            cfg.min_group_fraction,
            cfg.group_grace_seconds,
            cfg.max_staleness,
            cfg.advantage,
            mask_overlong=cfg.overlong == "mask",
            penalty=overlong_penalty_of(cfg),
        )
        self.ready: list[Group] = []
        resume = agree(world, checkpoint.latest(self.ckpt_dir))
        self.state = checkpoint.load_state(resume) if resume else checkpoint.State()
        # The processes that train together (torchrun); this one leads: it serves the ingest
        # and tells the others each step, push and checkpoint (``follow``).
        self.world = world
        self.last_told = time.monotonic()
        # Told to stop: after the final checkpoint, or when this process stops.
        self.followers_stopped = False
        if world.sharded and cfg.weight_sync == "nccl":
            raise ValueError("grpo.weightSync NCCL is for one training process; use File")
        policy = load_policy(cfg, world, resume)
        self.placement, self.model = policy.placement, policy.model
        self.vocab_rows = _vocab_rows(self.model)
        self.optimizer, self.reference = policy.optimizer, policy.reference
        self.memory_plan = policy.memory_plan
        self.lora_status = None
        if cfg.lora:
            self.lora_status = {
                "rank": cfg.lora.rank,
                "alpha": cfg.lora.alpha,
                "targetModules": list(cfg.lora.targets),
                "trainableParameters": sum(p.numel() for p in lora.trainable(self.model)),
            }
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        if not cfg.lora:
            config = Path(resume or cfg.model) / "config.json"
            shutil.copy(config, self.weights_dir / "config.json")
        if resume or cfg.weight_sync == "nccl" or cfg.lora:
            wait_healthy(cfg.policy_url)
        self.sync = self._weight_sync()
        # A push failed: vLLM may be left paused (``check_policy_server`` resumes it).
        self.resume_owed = False
        self.buffer.restore(
            self.state.closed_groups,
            self.state.failed_samples,
            self.state.lost_versions,
            time.time(),
        )
        # What this trainer pushed before, by its own record: a vLLM restarted with it (both
        # in the pod that was deleted) serves the base weights and says nothing of them.
        pushed = read_pushed_version(self.ckpt_dir)
        try:
            served = parse_version(served_label(cfg.policy_url))
        except OSError:
            served = None  # not up yet: it starts with the model's own weights
        known = [v for v in (served, pushed) if v is not None]
        lost = self._skip_versions_up_to(max(known) if known else None)
        if resume or cfg.lora or lost:
            # vLLM may serve weights newer than the checkpoint: serve the checkpoint's again.
            # With LoRA, the adapter gateways ask for exists only once pushed: before this
            # trainer is ready (the job's sessions wait for it).
            self._push(self.state.policy_version)
        self.store = Store(cfg.ingest_dir or cfg.state_dir / "ingest")
        self.ingest = Ingest(self.store, self.add)
        self.metrics.watch_ingest(self.ingest.counts)
        # Sessions already counted in the reward by version (``_count_sampled``).
        self.seen: set[str] = set(self.state.seen_sessions)
        # Sessions done with at the checkpoint (their groups closed: trained or dropped), and
        # the group of each session added since (the next checkpoint's settled ones).
        self.settled: set[str] = set(self.state.settled_sessions) | set(self.state.trained_sessions)
        self.group_of: dict[str, str] = {}
        # The stored trajectories the checkpoint lacks were counted to Prometheus by the
        # process that took them: counted again here, a restart's counter (from 0) would add
        # them twice to every increase() over it.
        self._replaying = True
        # Samples whose stored trajectory no longer reads (``_unreadable``): gone, after the
        # replay (another attempt's may be stored).
        self.unreadable_samples: list[tuple[str, int]] = []
        for t in self.store.load(skip=self.settled.__contains__, on_unreadable=self._unreadable):
            if t.session in self.seen and t.group in self.buffer.closed:
                # Dropped before a checkpoint older than ``settled_sessions``: counted then.
                self.settled.add(t.session)
                continue
            self.add(t)
        self._replaying = False
        # Failures ruled since the checkpoint (it keeps those before): after the replay, so a
        # sample whose trajectory is stored is not counted as failed.
        for group, sample in [*self.store.failures(), *self.unreadable_samples]:
            if group not in self.buffer.closed:
                self.buffer.sample_failed(group, sample, time.time())
        # What the restore and the replay dropped again was counted by the process that took
        # it: from here on only this process's own drops are reported (Prometheus reads the
        # counter's restart from 0 as new increase: replayed drops would show as a burst).
        self.dropped_at_start = Counter(self.buffer.dropped)
        self.loss_cfg = loss_config(cfg)
        self.metrics.progress(self.state.step, self.state.policy_version)
        self.waiting_since = time.monotonic()
        self.finishing = False
        self.finished = False
        # A step (train + push) is running: its groups are neither pending nor ready.
        self.training = False
        self.final_checkpoint: Path | None = None
        self.repushes = 0
        self.next_served_check = 0.0
        # One row per step of the job (summary tables, reward curves): those up to the
        # checkpoint it resumed from, then this process's. Saved with each checkpoint.
        self.steps: list[dict] = self.state.steps
        self.resumed_from_step = self.state.step
        self.checkpointed = self._progress()

    def _progress(self) -> tuple[int, int, int]:
        """What a checkpoint keeps that a restart would otherwise do again: the steps, and the
        groups taken without a step (every update's gradient not finite: the same weights, but
        those groups must not be trained again)."""
        s = self.state
        return (s.step, s.groups_done, len(s.trained_sessions))

    def _push(self, version: int) -> None:
        """Every push: its version is recorded (synced) before vLLM may serve it, so that a
        trainer resumed from an older checkpoint never labels other weights with it. Beside
        the checkpoints, which outlive the pod (its state directory may not)."""
        try:
            record_pushed_version(self.ckpt_dir, version)
        except OSError as e:
            # Not vLLM's failure, and no reason to stop training: said as what it is.
            log.error(
                "cannot record policy version %d as pushed in %s (%s): a trainer resumed with "
                "a restarted vLLM may label other weights with it",
                version,
                self.ckpt_dir,
                e,
            )
        try:
            self.sync.push(version)
        except OSError:
            # It may have failed past the pause, its own resume too: vLLM would stay paused
            # (every agent's call waiting) while its label already names the version.
            self.resume_owed = True
            raise
        self.resume_owed = False

    def _skip_versions_up_to(self, served: int | None) -> bool:
        """vLLM outlives a trainer that crashed: it may serve a version this trainer, resumed
        from an older checkpoint (or from none), never had. A label must never name two sets
        of weights: the versions up to ``served`` are marked lost (samples of them are stale)
        and this trainer goes on from the version after them; its caller pushes its weights
        as that one. True when that happened."""
        version = self.state.policy_version
        if served is None or served <= version:
            return False
        log.warning(
            "policy version %d was served (vLLM's label, or this trainer's record of its "
            "pushes), this trainer is at %d: versions %d..%d are "
            "lost (their samples are dropped as stale); going on from version %d",
            served,
            version,
            version + 1,
            served,
            served + 1,
        )
        self.buffer.lose(version + 1, served)
        self.state.policy_version = served + 1
        self.metrics.progress(self.state.step, self.state.policy_version)
        return True

    def _weight_sync(self) -> FileWeightSync | NcclWeightSync | lora.LoraWeightSync:
        if self.cfg.lora:
            return lora.LoraWeightSync(
                self.model, self.adapter_weights, self.cfg.policy_url, self.weights_dir
            )
        if self.cfg.weight_sync != "nccl":
            dtype = push_dtype(self.cfg.serving_dtype)
            return FileWeightSync(self.full_weights, self.cfg.policy_url, self.weights_dir, dtype)
        # NCCL sends in the dtype vLLM keeps: the job's ``--dtype`` when it names one (bf16
        # buffers into an fp32 or fp16 server would round every push), else bf16.
        return NcclWeightSync(
            self.model,
            self.cfg.policy_url,
            master_port=self.cfg.nccl_port,
            vllm_world_size=self.cfg.vllm_gpus,
            served_dtype=push_dtype(self.cfg.serving_dtype) or torch.bfloat16,
        )

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The whole weights (gathered from every process when sharded)."""
        self._tell("weights")
        return full_state_dict(self.model, self.world)

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """A LoRA policy's adapter, whole (gathered without its frozen base when sharded)."""
        self._tell("adapter")
        return full_state_dict(self.model, self.world, trainable_only=True)

    def _tell(self, *command) -> None:
        tell(self.world, *command)
        self.last_told = time.monotonic()

    def heartbeat(self, now: float | None = None) -> None:
        """Called while idle: the other processes hear from the leader at least every
        ``HEARTBEAT_SECONDS`` (their wait for its next order would time out)."""
        now = time.monotonic() if now is None else now
        idle_for = now - self.last_told
        if self.world.sharded and not self.followers_stopped and idle_for >= HEARTBEAT_SECONDS:
            self._tell("noop")

    def stop_followers(self) -> None:
        if not self.followers_stopped:
            self._tell("stop")
            self.followers_stopped = True

    def _unreadable(self, path: Path, error: Exception) -> None:
        """A stored trajectory the replay cannot read: its session is lost to learning
        (counted as ``invalid``, the alert ``FloeTrainerSessionsLost``), the rest replays.
        When the file still says whose sample it was and that it was scored and trainable (JSON
        a stricter trainer refuses), its group completes without it after the replay: that
        sample will not come again (its gateway was answered, and a scored session is not run
        again), and with ``minGroupFraction: 1`` the group would wait for the job's end, and
        under ``maxStaleness`` could hold the job with it. An untrainable one's sample is run
        again (another attempt), so its group waits for that."""
        log.error("cannot replay %s (%s): its session is left out", path, error)
        self.ingest.counts["invalid"] += 1
        # Counted before the first scrape of a new pod, the counter starts at 1 there, which
        # no ``increase()`` sees: a gauge says it (``FloeTrainerSessionsLost``).
        self.metrics.replay_unreadable.inc()
        try:
            body = json.loads(path.read_bytes())
            group, sample = body["group"], body["sample"]
            scored = body["trainable"] is True and body["reward"] is not None
        except (OSError, ValueError, KeyError, TypeError):
            return
        if scored and isinstance(group, str) and type(sample) is int and sample >= 0:
            self.unreadable_samples.append((group, sample))

    def add(self, t: Trajectory) -> None:
        if self.vocab_rows is not None and _past_vocabulary(t, self.vocab_rows):
            # A token id the model has no row for fails the step it is in (on a GPU a device
            # assert), and then every replay after a restart: the trainer would never train
            # again. (vLLM samples none; a gateway of another model could ship one.)
            log.error(
                "session %s carries a token id past the model's %d rows: left out",
                t.session,
                self.vocab_rows,
            )
            with self.lock:
                self.group_of[t.session] = t.group
                if t.session not in self.seen:
                    self.seen.add(t.session)
                    self.buffer.dropped["out_of_vocabulary"] += 1
                # It will not come again (its gateway was answered 200): the group completes
                # without it, as without a sample failed for good, instead of waiting for it.
                self.buffer.sample_failed(t.group, t.sample, time.time())
            return
        with self.lock:
            self.group_of[t.session] = t.group
            # Counted once scored: an untrainable one first (its gateway drained) leaves the
            # session to count when a ruling scores it.
            if t.session not in self.seen and t.reward is not None:
                self.seen.add(t.session)
                self._count_sampled(t)
            self.buffer.add(t, time.time())

    def _count_sampled(self, t: Trajectory) -> None:
        """Every scored session, whatever becomes of its group: the reward each policy version
        earned (a curve of trained groups alone reads lower as the policy gets better, since
        groups that all pass are dropped)."""
        if t.reward is None:
            return
        version = min(t.policy_versions) if t.policy_versions else 0
        row = self.state.sampled.setdefault(str(version), [0.0, 0.0, 0.0, 0.0])
        passed = t.reward >= self.cfg.pass_threshold
        overlong = t.overlong_turns > 0
        row[0] += 1
        row[1] += t.reward
        row[2] += 1.0 if passed else 0.0
        row[3] += 1.0 if overlong else 0.0
        if not self._replaying:
            self.metrics.sampled(t.reward, passed, overlong)

    def sampled_by_version(self) -> list[dict]:
        out = []
        for v, (n, total, passed, overlong) in sorted(
            self.state.sampled.items(), key=lambda kv: int(kv[0])
        ):
            out.append(
                {
                    "policyVersion": int(v),
                    "sessions": int(n),
                    "rewardMean": total / n if n else 0.0,
                    "passRate": passed / n if n else 0.0,
                    # Sessions with a call cut at its token cap (``grpo.overlong``).
                    "overlongFraction": overlong / n if n else 0.0,
                }
            )
        return out

    def fidelity(self, traces: list) -> dict:
        """The trainer's log-probs of sampled tokens against vLLM's (``fidelity``): the check a
        train run makes before its first session. Never during a step (the model's lock)."""
        if self.world.size > 1:
            # The other processes hear the leader's orders from the loop's thread only (two
            # threads telling at once would interleave their collectives): queued for it.
            answer: Future = Future()
            self.fidelity_requests.put((traces, answer))
            return answer.result(timeout=600)
        with self.model_lock:
            return fidelity.compare(self.model, traces, self.placement, self.loss_cfg.temperature)

    def serve_fidelity(self) -> None:
        """The loop's thread: the fidelity checks waiting, each made by every process."""
        while True:
            try:
                traces, answer = self.fidelity_requests.get_nowait()
            except queue.Empty:
                return
            if self.followers_stopped:
                answer.set_exception(RuntimeError("the trainer's processes have stopped"))
                continue
            self._tell("fidelity", traces)
            try:
                with self.model_lock:
                    temperature = self.loss_cfg.temperature
                    answer.set_result(
                        fidelity.compare(self.model, traces, self.placement, temperature)
                    )
            except Exception as e:
                # The caller hears why; the trainer cannot go on: the other processes may be
                # inside a collective this one left, and its next order would pair with it.
                answer.set_exception(e)
                raise

    def sample_failed(
        self, group: str, sample: int, session: str | None = None, agent_fault: str | None = None
    ) -> dict:
        """That sample's session failed for good: no trajectory of it will come, so its group
        completes without it. Unless the failure was the agent's own doing (``agent_fault``)
        and its gateway posted snapshots of the session while it ran: the last one is scored the
        job's failure reward and joins its group, a loss like any other. Told again (the
        operator tells until it hears back), it changes nothing."""
        with self.ruling_lock:
            stored = session is not None and self.ingest.has(session)
            # An untrainable trajectory stored (the pod's gateway drained as the operator let
            # the pod go, this ruling not heard yet) gives way to the agent's loss, when a
            # snapshot of the session is there to score.
            ruled_over = (
                stored
                and agent_fault is not None
                and self.ingest.store.partial_path(session).exists()
                and self.ingest.store.untrainable(session)
            )
            if stored and not ruled_over:
                # A ruling told again, or the session's own trajectory came: that stands. Its
                # group needs no more of it, unless that trajectory was one it dropped (then
                # the sample will not arrive).
                lost_loss = (
                    agent_fault is not None
                    and self.ingest.store.untrainable(session)
                    and not self.ingest.store.failure_path(group, sample).exists()
                )
                if lost_loss:
                    # The agent's loss, drained as untrainable with no snapshot to score: lost
                    # as when the ruling comes first (``agentFaultUnscored``), counted once.
                    self.ingest.counts["agentFaultUnscored"] += 1
                    log.warning(
                        "session %s: ruled the agent's fault, but no snapshot of it is kept",
                        session,
                    )
                self._sample_lost(group, sample, session, agent_fault)
                return {"known": True, "session": session}
            scored = (
                self.ingest.score_partial(
                    session, group, sample, agent_fault, self.cfg.failure_reward
                )
                if session is not None and agent_fault is not None
                else None
            )
            if scored is not None:
                self.metrics.agent_faults.inc()
                self.add(scored)
                log.info(
                    "session %s: the agent's own failure (%s), scored %s",
                    session,
                    agent_fault,
                    self.cfg.failure_reward,
                )
                return {"scored": self.cfg.failure_reward, "session": session}
            self._sample_lost(group, sample, session, agent_fault)
            return {"failed": True}

    def _sample_lost(
        self, group: str, sample: int, session: str | None, agent_fault: str | None
    ) -> None:
        """Its group completes without ``sample``: kept on disk first (a restart before the
        next checkpoint still knows it), and a snapshot not the agent's doing, which will
        never train, dropped."""
        if session is not None and agent_fault is None:
            self.ingest.store.drop_partial(session)
        self.ingest.store.put_failure(group, sample)
        with self.lock:
            self.buffer.sample_failed(group, sample, time.time())

    def finish(self) -> None:
        """No more trajectories will come: train what is left, then the final checkpoint."""
        with self.lock:
            self.finishing = True
        # Every session is done and every failure told (the operator waits for that): no
        # snapshot will be scored now.
        self.ingest.store.drop_partials()

    def run_once(self, now: float | None = None) -> StepStats | None:
        """Train one step if enough groups are ready; the loop calls this."""
        now = time.time() if now is None else now
        with self.lock:
            stale_before = self.buffer.dropped["stale"]
            dropped_before = self.buffer.groups_dropped
            self.ready += self.buffer.take_ready(
                now, self.state.policy_version, leftovers=self.finishing
            )
            self.state.groups_done += self.buffer.groups_dropped - dropped_before
            self.metrics.dropped(self._dropped_here())
            groups: list[Group] = []
            if self.ready:
                # Taken maybe steps ago: staleness is what it is now, as the step starts; then
                # the oldest first (a stale group at the front would leave the step short).
                before = self.buffer.groups_dropped
                fresh = self.buffer.still_fresh(self.ready, self.state.policy_version)
                self.ready = GroupBuffer.oldest_first(fresh)
                self.state.groups_done += self.buffer.groups_dropped - before
                self.metrics.dropped(self._dropped_here())
            if len(self.ready) >= self.cfg.groups_per_step or (self.finishing and self.ready):
                groups, self.ready = (
                    self.ready[: self.cfg.groups_per_step],
                    self.ready[self.cfg.groups_per_step :],
                )
            # Done only with nothing left anywhere.
            done = (
                self.finishing and not self.finished and not self.buffer.pending and not self.ready
            )
            self.training = bool(groups)
        if not groups:
            if done:
                self._final_checkpoint()
            return None
        try:
            with self.model_lock:
                return self._step(groups, stale_before)
        finally:
            with self.lock:
                self.training = False

    def _step(self, groups: list[Group], stale_before: int) -> StepStats:
        waited = time.monotonic() - self.waiting_since
        t0 = time.monotonic()
        self._tell("step", groups, self.state.step)
        stats = train_step(
            self.model,
            self.optimizer,
            groups,
            self.loss_cfg,
            placement=self.placement,
            reference=self.reference,
            seed=self.state.step,
            world=self.world,
            **step_options(self.cfg),
        )
        t1 = time.monotonic()
        s = self.state
        if stats.updates == 0:
            # Nothing trained (every trace masked or empty, or every update's gradient norm not
            # finite): the same weights, so no push and no new version, which would use up the
            # staleness its samples are allowed. Groups whose gradients were not finite are not
            # queued again: they would give the same gradients.
            if stats.skipped_updates:
                self.metrics.skipped_updates.inc(stats.skipped_updates)
                log.warning(
                    "step %d: all %d updates skipped (gradient norm not finite); %d groups "
                    "dropped, weights unchanged",
                    s.step + 1,
                    stats.skipped_updates,
                    len(groups),
                )
            s.trained_sessions += [t.session for g in groups for t in g.trajectories]
            s.groups_done += len(groups)
            # Neither trained nor dropped before: such groups vanished from the counts.
            self.buffer.dropped["no_update"] += len(groups)
            self.metrics.dropped(self._dropped_here())
            self.waiting_since = time.monotonic()
            return stats
        try:
            self._push(s.policy_version + 1)
        except OSError as e:
            # vLLM unreachable (stopping with the pod: every container gets the pod's SIGTERM
            # at once; or restarting), or failing now (a 5xx: its engine died; a 429). The step
            # stands: its weights are this trainer's, a stop still checkpoints them, and
            # ``check_policy_server`` pushes them again to a vLLM that answers with other
            # weights. (A 5xx ended the trainer here, its step neither counted nor
            # checkpointed: a restart went back to the last periodic checkpoint.)
            if not push_failure_passes(e):
                raise
            log.warning(
                "push of policy version %d failed (%s): pushed again later", s.policy_version + 1, e
            )
        t2 = time.monotonic()
        lags = [
            self.buffer.lag(min(t.policy_versions), s.policy_version)
            for g in groups
            for t in g.trajectories
            if t.policy_versions
        ]
        s.step += 1
        s.policy_version += 1
        s.last_step_time = datetime.datetime.now(datetime.timezone.utc).isoformat()
        s.trained_sessions += [t.session for g in groups for t in g.trajectories]
        s.groups_done += len(groups)
        rewards = [r for g in groups for r in g.rewards]
        passed = sum(r >= self.cfg.pass_threshold for r in rewards) / max(len(rewards), 1)
        self.metrics.step(stats, passed, waited, t1 - t0, t2 - t1)
        self.metrics.groups_trained.inc(len(groups))
        self.metrics.lags(lags)
        self.metrics.progress(s.step, s.policy_version)
        with self.lock:
            self.steps.append(
                {
                    "step": s.step,
                    "policyVersion": s.policy_version,
                    "groups": len(groups),
                    "sequences": stats.sequences,
                    "tokens": stats.tokens,
                    "rewardMean": stats.reward_mean,
                    "passRate": passed,
                    "loss": stats.loss,
                    "updates": stats.updates,
                    "skippedUpdates": stats.skipped_updates,
                    "clipFraction": stats.clip_fraction,
                    "clipFractionHigh": stats.clip_fraction_high,
                    "clipFractionLow": stats.clip_fraction_low,
                    "clipFractionDual": stats.clip_fraction_dual,
                    "logprobMismatch": stats.logprob_mismatch,
                    "tisMean": stats.tis_mean,
                    "tisTruncatedFraction": stats.tis_truncated_fraction,
                    "behaviourUnknownFraction": stats.behaviour_unknown_fraction,
                    "entropy": stats.entropy,
                    "advantageMean": stats.advantage_mean,
                    "advantageStd": stats.advantage_std,
                    "responseTokensMean": stats.response_tokens_mean,
                    "responseTokensMax": stats.response_tokens_max,
                    "computedTokens": stats.computed_tokens,
                    "traceTokens": stats.trace_tokens,
                    "gradNorm": stats.grad_norm,
                    "gradNorms": stats.grad_norms,
                    "overlongSessions": stats.overlong_sessions,
                    "maskedSessions": stats.masked_sessions,
                    "penalizedSessions": stats.penalized_sessions,
                    "overlongPenalty": stats.overlong_penalty_mean,
                    "versionLagMax": max(lags, default=0),
                    "staleDrops": self.buffer.dropped["stale"] - stale_before,
                    "waitSeconds": round(waited, 3),
                    "trainSeconds": round(t1 - t0, 3),
                    "pushSeconds": round(t2 - t1, 3),
                    "time": s.last_step_time,
                }
            )
        if s.step % self.cfg.checkpoint_every == 0:
            self.save_checkpoint()
        self.waiting_since = time.monotonic()
        return stats

    def save_checkpoint(self) -> None:
        """A checkpoint of the current step, unless there is one already (a stopped trainer
        writes one, so a restart trains nothing again that it had trained). Called by the
        thread that trains, never while a step runs; the lock stays free for the ingest."""
        if self._progress() == self.checkpointed or self.followers_stopped:
            return
        self._tell("checkpoint")
        # A LoRA checkpoint holds the adapter alone.
        weights = full_state_dict(self.model, self.world, trainable_only=bool(self.cfg.lora))
        optimizer = full_optimizer_state(self.model, self.optimizer, self.world)
        with self.lock:
            # The ingest's thread goes on adding: a copy, whole as of now.
            state = copy.deepcopy(self.state)
            saved = self.buffer.saved({g.group for g in self.ready})
            closed = set(saved["closed_groups"])
            settled = {s for s, g in self.group_of.items() if g in closed}
            state = dataclasses.replace(
                state,
                **saved,
                seen_sessions=sorted(self.seen),
                # Those not in ``trained_sessions`` already (a restart skips both).
                settled_sessions=sorted((self.settled | settled) - set(state.trained_sessions)),
            )
        checkpoint.save(
            self.ckpt_dir, self.model, weights, optimizer, state, self.cfg.checkpoint_keep
        )
        self.checkpointed = (state.step, state.groups_done, len(state.trained_sessions))
        with self.lock:
            # Written: a restart never reads them again; this process need not remember them.
            self.settled |= settled
            for session in settled:
                self.group_of.pop(session, None)
        try:
            self.store.drop_failures(closed)
            # An untrainable trajectory keeps its session's snapshot for a ruling (the agent's
            # fault); its group closed, none will come.
            for session in settled:
                self.store.drop_partial(session)
        except OSError as e:
            log.warning("cannot forget the failures of closed groups: %s", e)

    def _final_checkpoint(self) -> None:
        final = self.cfg.final_dir or self.ckpt_dir / "final"
        # The resumable state of the last step first, on every world size: a trainer killed
        # without its stop (a node lost, an OOM kill) after this resumes from it. From an older
        # periodic checkpoint it would train that step's weights on and write them over
        # ``final/``: the job's model silently steps back (up to ``everySteps`` − 1 steps).
        self.save_checkpoint()
        if self.cfg.lora and not self.cfg.lora.merge_final:
            lora.save_adapter(self.model, final, self.adapter_weights())
        elif self.cfg.lora:
            whole = self.full_weights()
            merged, rounding = lora.merged_weights(whole, self.cfg.lora)
            # The adapter beside it is exact; the merge may not be (16-bit weights).
            (log.warning if rounding > MERGE_ROUNDING_WARN else log.info)(
                "final model: the merge kept the adapter's change within %.1f%% (16-bit "
                "rounding); final/adapter/ holds it exactly",
                100 * rounding,
            )
            checkpoint.save_model(final, self.model.get_base_model(), merged, Path(self.cfg.model))
            lora.save_adapter(self.model, final / "adapter", whole)
        else:
            checkpoint.save_model(final, self.model, self.full_weights(), Path(self.cfg.model))
        if self.world.sharded:
            # Nothing is left for the other processes (the resumable state is saved above):
            # they end (their pods' GPUs go free; the job's end deletes them) and this one
            # serves its status alone. Before "finished": the job's end, which that answer
            # starts, finds everything on disk.
            self.stop_followers()
        with self.lock:
            self.final_checkpoint = final
            self.finished = True
        self.metrics.finished.set(1)

    def check_policy_server(self, now: float | None = None) -> None:
        """Every ``served_check_seconds``: a vLLM serving other weights than the trainer's
        (restarted: the base weights again) gets the current ones pushed."""
        now = time.monotonic() if now is None else now
        if now < self.next_served_check:
            return
        self.next_served_check = now + self.cfg.served_check_seconds
        try:
            label = served_label(self.cfg.policy_url)
        except OSError:
            return  # down or restarting: asked again next time
        if self.resume_owed:
            try:
                resume(self.cfg.policy_url)
                self.resume_owed = False
            except OSError as e:
                log.warning("cannot resume vLLM's generation after a failed push (%s)", e)
        served = parse_version(label)
        self.metrics.served_version.set(-1 if served is None else served)
        # With LoRA the trainer labels every push, version 0 too: vLLM's base label means the
        # adapter is not loaded (a restarted server).
        lost = self.cfg.lora is not None and label == BASE_VERSION_LABEL
        lost |= self._skip_versions_up_to(served)
        if served != self.state.policy_version or lost:
            log.warning(
                "vLLM serves policy version %s, the trainer is at %d: pushing again",
                served,
                self.state.policy_version,
            )
            try:
                self._push(self.state.policy_version)
            except OSError as e:
                if not push_failure_passes(e):
                    raise
                log.warning(
                    "pushing policy version %d again failed (%s): tried again later",
                    self.state.policy_version,
                    e,
                )
                return
            self.repushes += 1
            self.metrics.repushes.inc()

    def _dropped_here(self) -> Counter:
        """What this process dropped, not what the restore and replay dropped again."""
        return self.buffer.dropped - self.dropped_at_start

    def status(self) -> dict:
        with self.lock:
            return {
                "step": self.state.step,
                "policyVersion": self.state.policy_version,
                "lastStepTime": self.state.last_step_time,
                "pendingGroups": len(self.buffer.pending),
                "readyGroups": len(self.ready),
                "groupsDone": self.state.groups_done,
                "training": self.training,
                "dropped": dict(self._dropped_here()),
                "ingest": dict(self.ingest.counts),
                "versionLag": {str(k): v for k, v in sorted(self.metrics.lag_counts.items())},
                "repushes": self.repushes,
                "finishing": self.finishing,
                "finished": self.finished,
                "finalCheckpoint": str(self.final_checkpoint) if self.final_checkpoint else None,
                "steps": list(self.steps),
                "sampled": self.sampled_by_version(),
                "resumedFromStep": self.resumed_from_step,
                "memoryPlan": self.memory_plan,
                "lora": self.lora_status,
            }

    def state_dict(self) -> dict:
        return asdict(self.state)


def _vocab_rows(model) -> int | None:
    """The rows of the model's input embedding: token ids must be below it (``None``: not
    known, no check)."""
    try:
        rows = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        return None
    return int(rows) if isinstance(rows, int) else None


def _past_vocabulary(t: Trajectory, rows: int) -> bool:
    return any(
        max(trace.prompt_token_ids, default=0) >= rows
        or max(trace.response_token_ids, default=0) >= rows
        for trace in t.traces
    )
