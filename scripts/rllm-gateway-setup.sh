#!/usr/bin/env bash
# rllm-model-gateway (PyPI), the Python trace-capturing gateway floe's gateway benchmark
# compares against, in a cached venv. Prints the venv's python.
set -euo pipefail
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
V=$CACHE/rllm-model-gateway-0.1.0-r1
if [ ! -f "$V/.complete" ]; then
  rm -rf "$V"
  python3 -m venv "$V"
  "$V/bin/pip" install -q rllm-model-gateway==0.1.0 >&2
  touch "$V/.complete"
fi
echo "$V/bin/python"
