#!/usr/bin/env bash
# The trainer's checks: ruff (lint + format) and pytest, with the vLLM venv's Python (it has
# torch, transformers and safetensors) plus pytest and ruff installed once into a cache folder
# keyed by their versions. Usage: scripts/trainer/test.sh PYTHON MODELS_DIR [pytest args...]
# (MODELS_DIR: scripts/vllm-cpu/setup.sh's converted models; the real-vLLM test serves a copy.)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/env.sh
PY=$1; export FLOE_TEST_MODELS=$2; shift 2
TOOLS="$FLOE_CACHE/pytools-pytest8.4.2-ruff0.14.5"
if [ ! -f "$TOOLS/.done" ]; then
  rm -rf "$TOOLS"
  "$PY" -m pip install --quiet --target "$TOOLS" pytest==8.4.2 ruff==0.14.5 >&2
  touch "$TOOLS/.done"
fi
cd trainer
export PYTHONPATH="$TOOLS:$PWD"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
# The slowest tests named at the end: where the suite's time goes, in every CI log.
"$PY" -m pytest -q --durations=12 "$@"
