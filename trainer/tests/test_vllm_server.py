"""The test servers' own cleanup: a vLLM or trainer started by a test (a process group of its
own) ends when pytest is killed, where no fixture teardown runs (``scripts/test.sh`` stopped
by SIGTERM left the trainer lane's vLLM running)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_a_server_started_by_a_test_ends_when_pytest_is_killed(tmp_path):
    pid_file = tmp_path / "server.pid"
    # Stands for pytest: starts a long-lived server the way the tests do, then waits.
    fake_pytest = textwrap.dedent(f"""
        import subprocess, sys, time
        sys.path.insert(0, {str(HERE)!r})
        from vllm_server import ending_with_pytest
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                  start_new_session=True, preexec_fn=ending_with_pytest())
        open({str(pid_file)!r}, "w").write(str(server.pid))
        time.sleep(600)
    """)
    runner = subprocess.Popen([sys.executable, "-c", fake_pytest])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the server was not started"
        time.sleep(0.05)
    server = int(pid_file.read_text())
    try:
        time.sleep(0.2)
        assert _alive(server), "the server did not start (its preexec_fn failed)"
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(server):
            assert time.monotonic() < deadline, "the server outlived the pytest that started it"
            time.sleep(0.05)
    finally:
        if _alive(server):
            os.kill(server, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
