#!/usr/bin/env bash
# Build a genuine kube-apiserver + kube-controller-manager v1.20.2 from Debian bookworm's
# `kubernetes` source package, and fetch etcd 3.4 + kubectl 1.20 from Debian, all into a
# versioned cache directory. Nothing is installed system-wide.
#
#   setup.sh            -> prints the bin dir (cached: ~1 s when warm, ~13 min cold on 2 cores)
#
# Cache: ${FLOE_CACHE:-~/.cache/floe}/kapi-$KAPI_CACHE_KEY. Bump KAPI_REV when this script
# changes what it builds, so stale caches are never reused.
set -euo pipefail
K8S_DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
K8S_VERSION=1.20.2
KAPI_REV=1
KAPI_CACHE_KEY="${K8S_VERSION}-r${KAPI_REV}"
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
P=$CACHE/kapi-$KAPI_CACHE_KEY
STAMP=$P/.complete

log() { echo "[kapi-setup $(date +%T)] $*" >&2; }

if [ -f "$STAMP" ]; then echo "$P/bin"; exit 0; fi

mkdir -p "$P"
# One builder at a time (parallel test binaries or CI steps may all call this).
exec 9>"$P/.lock"
flock 9
if [ -f "$STAMP" ]; then echo "$P/bin"; exit 0; fi

rm -rf "$P/bin"
mkdir -p "$P/bin"
# shellcheck source=k8s-source.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/k8s-source.sh"
# Go, the sources, reflect2 (fix 1 is applied there), etcd 3.4 and kubectl 1.20.
k8s_source "$P" etcd-server kubernetes-client

# Fix 2: pkg/generated/openapi is generated code that the source tarball does not carry.
log "generate pkg/generated/openapi with the vendored openapi-gen"
go build -o "$P/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
DIRS=$(find -H . \( -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) \) -type f -name '*.go' -print0 \
  | xargs -0 grep -l '+k8s:openapi-gen=' | sed 's|^./staging/src|vendor|; s|^./||' \
  | grep -v -E '^vendor/k8s.io/(code-generator|sample-apiserver)/' | xargs -n1 dirname | LC_ALL=C sort -u)
"$P/bin/openapi-gen" -i "$(echo "$DIRS" | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)" \
  -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
  -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$P/openapi-violations.report" 2>/dev/null
# The known API-rule exceptions must match exactly, or the generated code is not what upstream ships.
diff -q <(sort "$P/openapi-violations.report") <(sort api/api-rules/violation_exceptions.list)

LD=$(k8s_ldflags)
for c in kube-apiserver kube-controller-manager; do
  log "go build $c"
  go build -trimpath -ldflags "$LD" -o "$P/bin/$c" "./cmd/$c"
done
ln -sf "$P/root/usr/bin/etcd" "$P/root/usr/bin/kubectl" "$P/bin/"
# The source tree and Go build cache are only needed to build; keep the cache small.
rm -rf "$P/src" "$P/gopath" "$P/debs" "$P/apt"
"$P/bin/kube-apiserver" --version >&2
touch "$STAMP"
log "done: $(ls "$P/bin" | tr '\n' ' ')"
echo "$P/bin"
