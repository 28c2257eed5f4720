#!/usr/bin/env bash
# The whole test suite: README's "test it". On a fresh Debian machine it installs what is
# missing, builds the heavy parts once into ~/.cache/floe (a genuine kube-apiserver from
# Debian's source package: ~4 min cold, ~0 s warm), starts them, runs every test, and stops
# what it started. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

# Debian packages the test scripts use (most machines already have them).
missing=()
for pair in curl:curl openssl:openssl flock:util-linux python3:python3 dpkg-deb:dpkg apt-get:apt; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[test] installing ${missing[*]}" >&2
  apt-get update -qq && apt-get install -y -qq "${missing[@]}"
fi

t0=$(date +%s)
FLOE_KAPI_BIN=$(scripts/kube-test-cluster/setup.sh)
export FLOE_KAPI_BIN
echo "[test] control-plane binaries ready in $(( $(date +%s) - t0 )) s ($FLOE_KAPI_BIN)" >&2

STATE=$(mktemp -d "${TMPDIR:-/tmp}/floe-kapi.XXXXXX")
cleanup() { scripts/kube-test-cluster/stop.sh "$STATE"; rm -rf "$STATE"; }
trap cleanup EXIT
FLOE_TEST_KUBECONFIG=$(scripts/kube-test-cluster/start.sh "$STATE")
export FLOE_TEST_KUBECONFIG

cargo test --workspace --locked "$@"
