"""``floe-trainer serve``: the trainer container of a RolloutJob's trainer pod. Reads the
operator's ``FLOE_TRAINER_CONFIG`` (JSON), serves ingest / status / metrics on
``ingestListen`` and trains until stopped."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from . import checkpoint
from .distributed import exit_process, from_env, leave
from .ingest import make_server
from .memory_plan import LoraTargetError, MemoryPlanError
from .placement import resolve
from .trainer import (
    Trainer,
    TrainerConfig,
    check_processes,
    expected_processes,
    follow,
    review_memory,
)

log = logging.getLogger("floe_trainer")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="floe-trainer")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="ingest trajectories and train (the trainer pod)")
    s.add_argument("--config", help="JSON file (default: $FLOE_TRAINER_CONFIG)")
    s.add_argument("--state-dir", default=os.environ.get("FLOE_TRAINER_STATE", "/tmp/floe-trainer"))
    s.add_argument("--poll-seconds", type=float, default=1.0)
    pl = sub.add_parser(
        "plan",
        help="the memory plan of the configured training step; exit 3 when it cannot fit",
    )
    pl.add_argument("--config", help="JSON file (default: $FLOE_TRAINER_CONFIG)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raw = Path(args.config).read_text() if args.config else os.environ.get("FLOE_TRAINER_CONFIG")
    if not raw:
        p.error("no configuration: --config FILE or FLOE_TRAINER_CONFIG")
    conf = json.loads(raw)
    state_dir = Path(getattr(args, "state_dir", "/tmp/floe-trainer"))
    try:
        cfg = TrainerConfig.from_operator(conf, state_dir)
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        if args.command == "plan":
            # Planned for the processes the job will start (``floe run`` asks before).
            processes = expected_processes(cfg) or processes
            print(json.dumps(review_memory(cfg, Path(cfg.model), processes)))
            return 0
        check_processes(cfg, processes)
        world = from_env(resolve(cfg.device, cfg.precision).device.type)
        if world.leader:
            # Only the first process (its pod alone mounts the checkpoint claim) keeps state.
            checkpoint.claim(cfg.checkpoint_dir, cfg.job, cfg.job_uid)
        if not world.leader:
            # Stopped by the leader only: torchrun passes a pod's SIGTERM to every process,
            # and the leader's last checkpoint needs them all.
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            try:
                return follow(cfg, world)
            finally:
                leave()
        trainer = Trainer(cfg, world)
    except (MemoryPlanError, LoraTargetError, checkpoint.ForeignCheckpoints) as e:
        refuse(str(e))
        return 3
    try:
        return serve(trainer, conf, args.poll_seconds)
    finally:
        leave()


def refuse(line: str) -> None:
    """One line on stderr and, in a pod, as the container's termination message (what the
    operator puts in the job's condition)."""
    print(line, file=sys.stderr, flush=True)
    message = Path("/dev/termination-log")  # the kubelet mounts it; never created here
    if message.exists():
        with contextlib.suppress(OSError):
            message.write_text(line)


def serve(trainer: Trainer, conf: dict, poll_seconds: float) -> int:
    server = start_server(trainer, conf)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return train_until_stopped(trainer, server, stop, poll_seconds)


def start_server(trainer: Trainer, conf: dict):
    """The ingest, status and metrics server on ``ingestListen``, serving in a thread."""
    host, _, port = conf.get("ingestListen", "0.0.0.0:8100").rpartition(":")
    server = make_server(
        trainer.ingest,
        (host, int(port)),
        trainer.status,
        trainer.metrics.render,
        finish=trainer.finish,
        failed=trainer.sample_failed,
        fidelity=trainer.fidelity,
        control_token=os.environ.get("FLOE_TRAINER_CONTROL_TOKEN"),
        ingest_token=os.environ.get("FLOE_TRAINER_INGEST_TOKEN") or None,
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log.info(
        "serving on %s:%s; step %d, policy version %d",
        host,
        port,
        trainer.state.step,
        trainer.state.policy_version,
    )
    return server


def train_until_stopped(
    trainer: Trainer, server, stop: threading.Event, poll_seconds: float
) -> int:
    """Train until ``stop`` is set, then write the stop checkpoint, serving all the while."""
    finished_logged = False
    while not stop.is_set():
        trainer.check_policy_server()
        trainer.serve_fidelity()
        stats = trainer.run_once()
        if stats is None:
            trainer.heartbeat()
            if trainer.finished and not finished_logged:
                log.info("finished; final checkpoint %s", trainer.final_checkpoint)
                finished_logged = True
            stop.wait(poll_seconds)
        else:
            log.info(
                "step %d (policy version %d): loss %.4f reward %.3f tokens %d clip %.3f",
                trainer.state.step,
                trainer.state.policy_version,
                stats.loss,
                stats.reward_mean,
                stats.tokens,
                stats.clip_fraction,
            )
    try:
        # Stopped (SIGTERM: a pod deleted, `floe run` interrupted): steps since the last
        # periodic checkpoint are kept, so a restart need not train their trajectories again.
        # The ingest serves until it is written: the pod's vLLM, stopping beside it, may still
        # answer a call whose snapshot comes after the SIGTERM, and a snapshot refused there
        # is a loss that vanishes if that agent is then evicted. What comes in meanwhile is
        # on disk, which a restart reads.
        trainer.save_checkpoint()
        trainer.stop_followers()
    finally:
        server.shutdown()
        server.server_close()
    return 0


def run() -> None:
    """The program (``floe-trainer``, ``python -m floe_trainer.cli``)."""
    exit_process(main())


if __name__ == "__main__":
    run()
