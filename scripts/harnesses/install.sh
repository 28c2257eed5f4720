#!/usr/bin/env bash
# Install a coding-agent harness CLI from npm into a versioned cache and print its bin path.
#   install.sh pi     -> .../node_modules/.bin/pi
#   install.sh codex  -> .../node_modules/.bin/codex
# Needs Node >= 20.6 and npm. The harness itself is never modified.
set -euo pipefail
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
case "${1:?usage: install.sh pi|codex}" in
  pi) PKG=@mariozechner/pi-coding-agent; VERSION=0.73.1; BIN=pi ;;
  codex) PKG=@openai/codex; VERSION=0.169.0; BIN=codex ;;
  *) echo "unknown harness $1" >&2; exit 2 ;;
esac
DIR=$CACHE/harnesses/$1-$VERSION
if [ ! -f "$DIR/.complete" ]; then
  rm -rf "$DIR"; mkdir -p "$DIR"
  (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error --prefix "$DIR" "$PKG@$VERSION" >&2)
  touch "$DIR/.complete"
fi
echo "$DIR/node_modules/.bin/$BIN"
