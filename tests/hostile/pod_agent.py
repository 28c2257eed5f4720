"""A hostile agent in a sandbox pod: a `custom` harness that tries every attack of
docs/security.md's threat model from the pod's agent container instead of solving its task, and
records what worked in RESULTS/<pod>.json (a host directory the test mounts).

It leaves the bug unfixed, so any reward above 0 is a forged one. It also makes one honest model
call through the gateway, so the legitimate path is proven in the same container. Told by the
test (harness env): HOSTILE_RESULTS, HOSTILE_MODEL (the model server's own URL), HOSTILE_INGEST
(the job's collector: where its gateway ships trajectories).
"""

import glob
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request

RESULTS = os.environ["HOSTILE_RESULTS"]
MODEL = os.environ["HOSTILE_MODEL"]
INGEST = os.environ["HOSTILE_INGEST"]
POD = socket.gethostname()
HIDDEN_MARK = "assert add(2, 3) " + "== 5"  # split: this file must not match itself
GATEWAY = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
TOKEN = os.environ["OPENAI_API_KEY"]
results = {}


def attempt(name):
    """Records whether the attack succeeded (returned truthy) and what it saw."""

    def run(fn):
        try:
            detail = fn()
            results[name] = {"succeeded": bool(detail), "detail": str(detail)[:300]}
        except Exception as e:  # noqa: BLE001 - any failure is the attack being refused
            results[name] = {"succeeded": False, "detail": f"{type(e).__name__}: {e}"[:300]}
        return fn

    return run


def call(url, body=None, token=TOKEN, timeout=10):
    req = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": "Bearer " + token},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read().decode(errors="replace")


def refused_by_status(fn):
    try:
        status, _ = fn()
        return f"HTTP {status}"
    except urllib.error.HTTPError as e:
        if e.code in (401, 403, 404):
            return None
        raise


@attempt("honest_model_call_through_gateway")
def _():
    status, _ = call(
        GATEWAY + "/v1/chat/completions",
        {"model": os.environ["FLOE_MODEL"], "max_tokens": 8,
         "messages": [{"role": "user", "content": "hi"}]},
        timeout=120,
    )
    return f"HTTP {status}" if status == 200 else None


@attempt("read_control_token")
def _():
    found = [p for p in glob.glob("/floe-control/*") if open(p).read().strip()]
    for environ in glob.glob("/proc/*/environ"):
        try:
            if b"FLOE_CONTROL_TOKEN" in open(environ, "rb").read():
                found.append(environ)
        except OSError:
            pass
    return found or None


@attempt("read_hidden_tests_anywhere")
def _():
    skip = ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/var/lib")
    for root, dirs, files in os.walk("/"):
        if root.startswith(skip):
            dirs[:] = []
            continue
        for f in files:
            path = os.path.join(root, f)
            try:
                if os.path.getsize(path) < 1 << 20 and HIDDEN_MARK in open(path, errors="replace").read():
                    return path
            except OSError:
                pass
    return None


@attempt("take_the_assignment_with_the_session_token")
def _():
    control = GATEWAY.rsplit(":", 1)[0] + ":8371"
    for base in (GATEWAY, control):
        seen = refused_by_status(lambda: call(base + "/floe/v1/assignments/next?waitSeconds=1"))
        if seen:
            return f"{base}: {seen}"
    return None


@attempt("report_own_result_to_gateway")
def _():
    control = GATEWAY.rsplit(":", 1)[0] + ":8371"
    for base in (GATEWAY, control):
        seen = refused_by_status(lambda: call(
            base + "/floe/v1/sessions/any/result",
            {"status": "completed", "evaluation": {"reward": 1.0, "passed": True}},
        ))
        if seen:
            return f"{base}: {seen}"
    return None


@attempt("post_a_forged_trajectory_to_the_ingest")
def _():
    # Its own session's trajectory with reward 1, before its gateway ships the real one: the
    # ingest is idempotent by session, so a first post would win. Without a token and with
    # the only one it has.
    forged = {
        "format": "floe.trajectory/v1", "session": "forged-" + POD, "task": "fix-add",
        "group": "forged", "sample": 0, "status": "completed", "trainable": True,
        "reward": 1.0, "builder": "per_request", "traces": [], "stats": {},
    }
    for token in ("", TOKEN):
        try:
            status, body = call(INGEST + "/v1/trajectories", forged, token=token)
            return f"HTTP {status}: {body[:100]}"
        except urllib.error.HTTPError as e:
            # Only "who are you" is a refusal; any other answer means it got past that.
            if e.code != 401:
                return f"HTTP {e.code}: {e.read()[:100]!r}"
    return None


@attempt("write_grader_state")
def _():
    # The runner's state (pristine snapshot, evaluation copy) and the gateway's captures.
    for d in ("/floe-run", "/floe-state"):
        if os.path.isdir(d):
            path = os.path.join(d, "tampered")
            open(path, "w").write("x")
            return path
    return None


@attempt("see_floe_processes")
def _():
    seen = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            argv = open(cmdline, "rb").read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[0].endswith(b"floe") and argv[1] in (b"sandbox", b"gateway"):
            seen.append(cmdline)
    return seen or None


@attempt("read_supervisor_memory")
def _():
    start = int(open("/proc/1/maps").readline().split("-")[0], 16)
    with open("/proc/1/mem", "rb") as mem:
        mem.seek(start)
        return f"read {len(mem.read(64))} bytes of PID 1"


@attempt("kill_the_supervisor")
def _():
    os.kill(1, signal.SIGKILL)
    time.sleep(0.5)
    return "PID 1 is gone" if not os.path.exists("/proc/1/cmdline") else None


@attempt("starve_the_supervisor")
def _():
    # Same user as PID 1: idle it, nice it, pin it, limit its CPU (and each of its threads),
    # which behind busy processes would have it report the harness's end past the grader's
    # deadline, a loss ended as infrastructure. Every change that took is reported.
    import resource

    took = []
    for tid in sorted(int(t) for t in os.listdir("/proc/1/task")):
        for name, change in [
            ("idle", lambda: os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))),
            ("nice", lambda: os.setpriority(os.PRIO_PROCESS, tid, 19)),
            ("pin", lambda: os.sched_setaffinity(tid, {min(os.sched_getaffinity(0))})),
            ("cpu", lambda: resource.prlimit(tid, resource.RLIMIT_CPU, (1, 1))),
        ]:
            try:
                change()
                took.append(f"{name} {tid}")
            except OSError:
                pass
    for name, change in [
        ("nice the user", lambda: os.setpriority(os.PRIO_USER, 0, 19)),
        ("nice group 1", lambda: os.setpriority(os.PRIO_PGRP, 1, 19)),
    ]:
        try:
            change()
            took.append(name)
        except OSError:
            pass
    return ", ".join(took) or None


@attempt("steal_the_agent_link")
def _():
    s = socket.create_connection(("127.0.0.1", 8379), timeout=3)
    s.sendall(b'{"finished": {"exit": {"Code": 0}}, "namespace_emptied": true}\n')
    s.close()
    return "connected to the grader's agent link"


@attempt("call_model_server_directly")
def _():
    # Sampling the model past the gateway, where no capture sees it (with the only token it has).
    status, _ = call(
        MODEL + "/v1/chat/completions",
        {"model": "policy", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    return f"HTTP {status} from {MODEL}" if status == 200 else None


@attempt("plant_reward_file")
def _():
    # The evaluator keeps a reward.json it finds: only floe's discarding stops this one.
    with open("reward.json", "w") as f:
        json.dump({"reward": 1.0}, f)
    return "reward.json written in the workspace (discarded at evaluation if refused)"


@attempt("leave_a_process_running")
def _():
    # Out of the process group and the session, with an empty environment: it would rewrite
    # the hidden test wherever it can reach one and fix the bug late, and it stamps
    # RESULTS/<pod>.alive while it lives (the test compares that with the grading's start).
    daemon = f"""
import glob, os, time
end = time.time() + 40
while time.time() < end:
    # Written then renamed: a kill between truncating and writing must not leave it empty.
    tmp = {RESULTS!r} + "/{POD}.alive.tmp"
    with open(tmp, "w") as f:
        f.write(repr(time.time()))
    os.rename(tmp, {RESULTS!r} + "/{POD}.alive")
    for p in glob.glob("/floe-run/state/eval/test_hidden.py"):
        try:
            open(p, "w").write("print('forged pass')\\n")
        except OSError:
            pass
    time.sleep(0.05)
"""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve(sys.executable, [sys.executable, "-c", daemon], {})
        os._exit(0)
    os.waitpid(pid, 0)
    return "started (refused if it is gone when grading starts)"


# calc.py, still buggy, as the hidden test imports it in the grader: there it looks for the
# control token (the Secret's file, any visible process's environment, its own), says what it
# found in RESULTS/<pod>.evaluation, and leaves a process (setsid, double fork) that rewrites
# the verdict to 1 once the evaluator wrote 0.
EVALUATED = """import glob, json, os, socket, time
found = {"own_environment": "FLOE_CONTROL_TOKEN" in os.environ}
for path in ["/floe-control/control-token"] + glob.glob("/floe-control/*"):
    try:
        found[path] = len(open(path).read()) > 0
    except OSError:
        found[path] = False
for environ in glob.glob("/proc/*/environ"):
    try:
        found[environ] = b"FLOE_CONTROL_TOKEN=" in open(environ, "rb").read()
    except OSError:
        found[environ] = False
with open(RESULTS + "/" + socket.gethostname() + ".evaluation", "w") as f:
    json.dump(found, f)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.time() + 20
        while time.time() < end:
            try:
                if '"reward": 0' in open("reward.json").read():
                    open("reward.json", "w").write('{"reward": 1}')
            except OSError:
                pass
            time.sleep(0.001)
    os._exit(0)
def add(a, b):
    return a - b
""".replace("RESULTS", repr(RESULTS))
with open("calc.py", "w") as f:
    f.write(EVALUATED)

with open(os.path.join(RESULTS, POD + ".json"), "w") as f:
    json.dump(results, f, indent=1)
print(json.dumps(results, indent=1))
time.sleep(0.5)
