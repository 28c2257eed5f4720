#!/usr/bin/env bash
# The trainer on a GPU, for a session lent one (never CI): converts SmolLM2-135M-Instruct from
# its GGUF, runs the optimizer-step benchmark (fp32 vs bf16 vs bf16 + gradient checkpointing,
# with GPU utilization from NVML; with and without prompt sharing), the memory plan's
# estimate against measured peaks, the unit and GPU tests, and the learning demo sampling
# with the trained model itself.
# vLLM is not used: its CUDA build cannot be installed on the lent machines (docs/trainer.md).
# Usage: scripts/trainer/gpu-proof.sh GGUF_DIR WORK_DIR   (env: PYTHON, STEPS, BENCH_ARGS)
set -euo pipefail
cd "$(dirname "$0")/../.."
G=$1 W=$2 PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
if [ ! -f "$W/smollm2-135m-instruct/model.safetensors" ]; then
  HF_HUB_OFFLINE=1 "$PY" scripts/vllm-cpu/prepare_models.py smollm2 "$W/smollm2-135m-instruct" "$G"
fi
export PYTHONPATH="$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The unit tests on this machine's torch/transformers, and the GPU tests (tests/test_gpu.py).
(cd trainer && FLOE_TEST_MODELS="$W" "$PY" -m pytest -q -rs -s tests -k "not real_vllm" -p no:cacheprovider)
# The memory plan against the allocator's peak on this GPU (docs/trainer.md, "The memory plan").
for probe in "--precision fp32 --sequence 4096" "--precision bf16 --sequence 8192 --gradient-checkpointing" \
             "--precision bf16 --sequence 2048 --micro-batch 4"; do
  # shellcheck disable=SC2086
  "$PY" -m floe_trainer.memory_probe --model-dir "$W/smollm2-135m-instruct" --device cuda $probe
done
# shellcheck disable=SC2086
"$PY" -m floe_trainer.bench_step --model-dir "$W/smollm2-135m-instruct" --device cuda ${BENCH_ARGS:-}
# Prompt sharing where it pays: a long shared prompt, responses of spread lengths (bf16 rows).
"$PY" -m floe_trainer.bench_step --model-dir "$W/smollm2-135m-instruct" --device cuda \
  --precisions bf16 --prompt 4096 --response 512 --response-min 64
"$PY" -m floe_trainer.learn_demo --local --model-dir "$W/smollm2-135m-instruct" --device cuda --steps "${STEPS:-30}"
