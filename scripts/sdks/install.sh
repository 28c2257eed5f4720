#!/usr/bin/env bash
# Install the official provider SDKs (Python and Node), pinned, into a versioned cache, and
# print the cache directory: <dir>/venv/bin/python has openai, anthropic and google-genai;
# <dir>/node_modules has openai, @anthropic-ai/sdk and @google/genai. The SDK test suite
# (tests/tests/official_sdks.rs) drives them against the gateway. Changing a pin changes the
# cache key. Needs python3 (with venv), Node >= 20 and npm; packages come from the registries
# the machine's pip and npm configuration name.
set -euo pipefail
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
PY_PINS="openai==3.57.0 anthropic==2.14.0 google-genai==3.6.1"
NODE_PINS="openai@7.57.0 @anthropic-ai/sdk@1.14.0 @google/genai@3.3.0"
KEY=$(printf '%s\n%s\n%s\n' "$PY_PINS" "$NODE_PINS" "$(python3 --version)" | cksum | cut -d' ' -f1)
DIR=$CACHE/sdks-$KEY
if [ ! -f "$DIR/.complete" ]; then
  rm -rf "$DIR"; mkdir -p "$DIR"
  python3 -m venv "$DIR/venv" >&2
  # shellcheck disable=SC2086
  "$DIR/venv/bin/pip" install --quiet --disable-pip-version-check $PY_PINS >&2
  # shellcheck disable=SC2086
  (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error --prefix "$DIR" $NODE_PINS >&2)
  touch "$DIR/.complete"
fi
echo "$DIR"
