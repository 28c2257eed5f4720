#!/usr/bin/env bash
# The trainer's scale features on a GPU, for a session lent one (never CI), with no weights to
# carry: models with published architectures and random weights (scripts/trainer/configs/),
# since memory and speed do not depend on the weights' values.
#   1. the memory plan's estimate against the allocator's peak (floe_trainer.memory_probe) for
#      SmolLM2-135M and for Qwen3-1.7B with examples/rolloutjob-train.yaml's own settings;
#      and a LoRA adapter on Qwen3-1.7B (PEFT from the machine's own packages);
#   2. FSDP2 over NCCL in one process (trainer/tests/fsdp_one_device.py): the sharded path's
#      weights against the plain path's after the same steps (fp32 at temperatures 1 and 0.7,
#      bf16), and both step times;
#   3. the trainer's unit and GPU tests on this machine's torch (in parallel with 1-2, on CPU).
# One JSON line per measurement in OUT/probes.jsonl. Usage: gpu-scale-proof.sh WORK_DIR OUT
# (env MODELS: the models to probe, default "smollm2-135m-instruct qwen3-1.7b").
set -uo pipefail
cd "$(dirname "$0")/../.."
W=$1 OUT=$2 PY=${PYTHON:-python3}
mkdir -p "$W" "$OUT"
export PYTHONPATH="$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
(cd trainer && "$PY" -m pytest -q -rs -p no:cacheprovider tests -k "not real_vllm and not fifth" \
  >"$OUT/pytest.log" 2>&1; echo "pytest rc=$?" >>"$OUT/pytest.log") &
tests=$!
MODELS=${MODELS:-smollm2-135m-instruct qwen3-1.7b}
for m in $MODELS; do
  "$PY" scripts/trainer/random_model.py "scripts/trainer/configs/$m.json" "$W/$m" 2>/dev/null
done
probe() {
  local model=$1; shift
  [[ " $MODELS " == *" $model "* ]] || return 0
  "$PY" -m floe_trainer.memory_probe --model-dir "$W/$model" --device cuda "$@" 2>"$OUT/probe.err" \
    | tee -a "$OUT/probes.jsonl" || tail -3 "$OUT/probe.err"
}
probe smollm2-135m-instruct --precision fp32 --sequence 4096
probe smollm2-135m-instruct --precision fp32 --sequence 4096 --temperature 0.7
probe smollm2-135m-instruct --precision fp32 --sequence 4096 --gradient-checkpointing
probe smollm2-135m-instruct --precision bf16 --sequence 8192 --gradient-checkpointing
probe smollm2-135m-instruct --precision bf16 --sequence 2048 --micro-batch 4
# examples/rolloutjob-train.yaml: 16K context, 4 traces per pass bounded by 32K tokens, gc.
probe qwen3-1.7b --precision bf16 --sequence 16384 --micro-batch 4 --max-tokens 32768 --gradient-checkpointing
# The same at a sampling temperature (the tempered log-probs divide each logits chunk).
probe qwen3-1.7b --precision bf16 --sequence 16384 --micro-batch 4 --max-tokens 32768 --gradient-checkpointing --temperature 0.7
probe qwen3-1.7b --precision bf16 --sequence 4096 --micro-batch 2
# The same with the allocator's fixed blocks (the trainer grows segments in place unless told).
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False probe qwen3-1.7b --precision bf16 --sequence 4096 --micro-batch 2
probe qwen3-1.7b --precision bf16 --sequence 8192 --gradient-checkpointing --reference
# LoRA (rank 16 on every projection): the example's settings, and the same 2 × 4,096 step.
probe qwen3-1.7b --precision bf16 --sequence 16384 --micro-batch 4 --max-tokens 32768 --gradient-checkpointing --lora-rank 16
probe qwen3-1.7b --precision bf16 --sequence 4096 --micro-batch 2 --lora-rank 16
if [[ " $MODELS " == *" smollm2-135m-instruct "* ]]; then
  "$PY" -m torch.distributed.run --nproc-per-node=1 trainer/tests/fsdp_one_device.py \
    "$W/smollm2-135m-instruct" 4 2>"$OUT/fsdp.err" | tee -a "$OUT/probes.jsonl" || tail -5 "$OUT/fsdp.err"
fi
wait "$tests"
tail -5 "$OUT/pytest.log"
