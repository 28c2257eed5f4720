#!/usr/bin/env bash
# Install a coding-agent harness CLI from npm into a versioned cache and print its bin path.
#   install.sh pi     -> .../node_modules/.bin/pi
#   install.sh codex  -> .../node_modules/.bin/codex
#   (also claude-code -> claude, qwen-code -> qwen, gemini-cli -> gemini)
# Needs Node >= 20.6 and npm. The harness itself is never modified.
set -euo pipefail
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
case "${1:?usage: install.sh pi|codex|claude-code|qwen-code|gemini-cli}" in
  pi) PKG=@mariozechner/pi-coding-agent; VERSION=0.73.1; BIN=pi ;;
  codex) PKG=@openai/codex; VERSION=0.169.0; BIN=codex ;;
  claude-code) PKG=@anthropic-ai/claude-code; VERSION=2.1.330; BIN=claude ;;
  qwen-code) PKG=@qwen-code/qwen-code; VERSION=0.24.4; BIN=qwen ;;
  gemini-cli) PKG=@google/gemini-cli; VERSION=0.61.0; BIN=gemini ;;
  *) echo "unknown harness $1" >&2; exit 2 ;;
esac
DIR=$CACHE/harnesses/$1-$VERSION
if [ ! -f "$DIR/.complete" ]; then
  rm -rf "$DIR"; mkdir -p "$DIR"
  (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error --prefix "$DIR" "$PKG@$VERSION" >&2)
  touch "$DIR/.complete"
fi
echo "$DIR/node_modules/.bin/$BIN"
