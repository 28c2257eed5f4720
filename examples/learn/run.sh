#!/usr/bin/env bash
# Watch a policy learn through floe's own path on this machine (2 cores, ~8 GB RAM, ~5 min):
# vLLM on CPU and SmolLM2-135M-Instruct (from PyPI, cached in ~/.cache/floe like the
# quickstart's), the floe trainer, and `floe run examples/learn/job.yaml`.
# Usage: examples/learn/run.sh [OUT_DIR [floe run flags…]]   (OUT_DIR default ./learn-out)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(realpath -m "${1:-learn-out}")
shift || true
cd "$ROOT"
# shellcheck source=../../scripts/env.sh
source scripts/env.sh
FLOE=$(floe_binary)
read -r VLLM_PYTHON VLLM_MODELS < <(scripts/vllm-cpu/setup.sh)
# The job names its model relative to itself: a copy of the job beside a link to the model.
JOB=$(mktemp -d "${TMPDIR:-/tmp}/floe-learn.XXXXXX")
trap 'rm -rf "$JOB"' EXIT
# LEARN_JOB=pi.yaml: the same loop with Pi (from npm) as the harness.
# LEARN_JOB=tools.yaml: a multi-turn agent that must run a command to answer (its tasks in JSONL).
cp "examples/learn/${LEARN_JOB:-job.yaml}" "$JOB/job.yaml"
cp examples/learn/*.jsonl "$JOB/"
# LEARN_MAX_STALENESS=N: the job's train.maxStaleness instead (the utilization run in
# docs/benchmarks.md: N=2 with `--concurrency 8`, so sampling runs on while the trainer steps).
if [ -n "${LEARN_MAX_STALENESS:-}" ]; then
  sed -i "s/^    maxStaleness: .*/    maxStaleness: $LEARN_MAX_STALENESS/" "$JOB/job.yaml"
  grep -q "^    maxStaleness: $LEARN_MAX_STALENESS\$" "$JOB/job.yaml" || { echo "[learn] ${LEARN_JOB:-job.yaml} sets no train.maxStaleness" >&2; exit 2; }
fi
if grep -q "preset: pi" "$JOB/job.yaml"; then
  PI=$(scripts/harnesses/install.sh pi)
  export PATH="$(dirname "$PI"):$PATH"
fi
ln -s "$VLLM_MODELS/smollm2-135m-instruct" "$JOB/model"
export PYTHONPATH="$ROOT/trainer${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
"$FLOE" run "$JOB/job.yaml" --out "$OUT" --vllm-python "$VLLM_PYTHON" --trainer-python "$VLLM_PYTHON" "$@"
echo "[learn] reward per step: $OUT/reward-curve.svg; numbers: $OUT/summary.json (training.steps)" >&2
