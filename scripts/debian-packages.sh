#!/usr/bin/env bash
# Debian packages the test scripts and the CI's benchmarks use (most machines already have
# them): installed when missing. Called by scripts/test.sh and, before its benchmarks (the
# local run benchmark confines agents with bubblewrap), by .ci/run.
set -euo pipefail
missing=()
for pair in curl:curl openssl:openssl flock:util-linux python3:python3 dpkg-deb:dpkg apt-get:apt node:nodejs npm:npm bwrap:bubblewrap; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
# Debian's system python3 ships venv/ensurepip separately (vLLM's venv needs them).
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing ${missing[*]}" >&2
  apt-get update -qq && apt-get install -y -qq "${missing[@]}"
fi
