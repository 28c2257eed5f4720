"""The fidelity check of a trainer of ``torchrun``'s processes (gloo, FSDP2): the leader's
``Trainer`` is asked from another thread, as its HTTP server does, and answers from its loop
with every process taking part (the others in ``follow``). The leader writes the answer to
``OUT/fidelity.json``; ``test_distributed.py`` compares it with one process's.

    fidelity_world.py MODEL_DIR OUT"""

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from floe_trainer.distributed import exit_process, from_env, leave  # noqa: E402
from floe_trainer.trainer import Trainer, TrainerConfig, follow  # noqa: E402
from floe_trainer.wire import Trace  # noqa: E402

TEMPERATURE = 0.7


def config(model_dir: str) -> dict:
    return {
        "model": model_dir,
        "policyUrl": "http://127.0.0.1:9",  # no vLLM: nothing here pushes
        "numSamples": 2,
        "temperature": TEMPERATURE,
        "grpo": {"groupsPerStep": 1, "learningRate": 1e-3, "microBatchSize": 2},
        "device": "cpu",
        "memoryPlan": "Warn",
    }


def probes() -> list[Trace]:
    """Two sampled traces with made-up vLLM log-probs (the figure compares against them)."""
    return [
        Trace([1, 2, 3], [4, 5, 6], [1] * 3, [-1.0, -2.0, -3.0]),
        Trace([7], [8, 9], [1, 1], [-0.5, -1.5]),
    ]


def main() -> int:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    cfg = TrainerConfig.from_operator(config(model_dir), out / "state")
    world = from_env("cpu")
    if not world.leader:
        return follow(cfg, world)
    trainer = Trainer(cfg, world)
    answer: dict = {}
    asked = threading.Thread(target=lambda: answer.update(trainer.fidelity(probes())))
    asked.start()
    while asked.is_alive():
        trainer.serve_fidelity()
        time.sleep(0.05)
    trainer.stop_followers()
    (out / "fidelity.json").write_text(json.dumps({"processes": world.size, **answer}))
    return 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        leave()
    exit_process(code)
