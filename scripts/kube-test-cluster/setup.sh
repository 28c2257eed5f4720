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

rm -rf "$P"/{debs,root,src,bin,apt,gopath}
mkdir -p "$P"/{debs,root,src,bin,apt/lists/partial}
cd "$P"

fetch_debs() {
  (cd debs && apt-get download -q golang-1.19-go golang-1.19-src etcd-server kubernetes-client \
    golang-github-modern-go-reflect2-dev >/dev/null 2>&1)
}
log "fetch Go 1.19, etcd 3.4, kubectl 1.20, reflect2 1.0.2 (.deb, extracted under $P/root)"
if ! fetch_debs; then
  log "apt lists look stale: apt-get update"
  apt-get update -qq >/dev/null 2>&1 || true
  fetch_debs || { log "apt-get download failed"; exit 1; }
fi
for d in debs/*.deb; do dpkg-deb -x "$d" root; done

log "fetch kubernetes $K8S_DEB_VERSION source package (private deb-src list)"
# The deb-src entry uses the mirror apt is already configured with (no host name in the repo).
MIRROR=$(apt-get indextargets --format '$(REPO_URI)' 'Identifier: Packages' 'Origin: Debian' 'Codename: bookworm' | head -1)
[ -n "$MIRROR" ] || { log "no Debian bookworm mirror in apt's configuration"; exit 1; }
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main" > apt/sources.list
APTOPT=(-o "Dir::Etc::SourceList=$P/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent -o "Dir::State::Lists=$P/apt/lists")
apt-get "${APTOPT[@]}" update -qq >/dev/null 2>&1
(cd src && apt-get "${APTOPT[@]}" source --download-only "kubernetes=$K8S_DEB_VERSION" >/dev/null 2>&1 \
  && tar xzf "kubernetes_1.20.5+really${K8S_VERSION}.orig.tar.gz")

export PATH=$P/root/usr/lib/go-1.19/bin:$PATH GOCACHE=$CACHE/gocache GOPATH=$P/gopath \
  GOPROXY=off GO111MODULE=off CGO_ENABLED=0 GOFLAGS=
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$P/src/kubernetes-$K8S_VERSION" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"

# Fix 1: vendored modern-go/reflect2 1.0.1 segfaults on Go >= 1.18; Debian ships 1.0.2.
log "patch vendored modern-go/reflect2 1.0.1 -> 1.0.2"
R=vendor/github.com/modern-go/reflect2
rm -f $R/*.go $R/*.s
cp "$P"/root/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} $R/
rm -f $R/*_test.go

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

LD="-s -w"
for V in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  LD="$LD -X $V.gitVersion=v$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=20 -X $V.gitTreeState=archive"
done
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
