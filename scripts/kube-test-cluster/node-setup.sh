#!/usr/bin/env bash
# Build what a genuine one-node cluster needs beside the control plane (setup.sh): kubelet,
# kube-scheduler and kube-proxy v1.20.2 from Debian bookworm's `kubernetes` source package (the
# same sources as the control plane), and the pause image built from that source (static, musl).
# containerd, runc, the CNI plugins and iptables come from Debian's packages (installed if
# missing; FLOE_NODE_NO_APT=1 skips that). No registry is needed: images are OCI archives that
# start-node.sh imports into its own containerd.
#
#   node-setup.sh       -> prints the cache dir (bin/, images/); ~0 s warm, ~1 min with the
#                          control plane's Go cache warm, ~5 min cold on 2 cores
#
# Cache: ${FLOE_CACHE:-~/.cache/floe}/knode-$K8S_VERSION-r$KNODE_REV. Go's build cache is the
# control plane's ($FLOE_CACHE/gocache): same sources, same -trimpath, so shared packages hit.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
K8S_DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
K8S_VERSION=1.20.2
KNODE_REV=1
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}
P=$CACHE/knode-$K8S_VERSION-r$KNODE_REV
STAMP=$P/.complete
log() { echo "[knode-setup $(date +%T)] $*" >&2; }

PKGS="containerd runc containernetworking-plugins iptables conntrack musl-tools"
if [ -z "${FLOE_NODE_NO_APT:-}" ]; then
  missing=$(for p in $PKGS; do
    s=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$s" = "install ok installed" ] || echo "$p"
  done)
  if [ -n "$missing" ]; then
    log "apt-get install" $missing
    apt-get update -qq >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
  fi
fi

if [ -f "$STAMP" ]; then echo "$P"; exit 0; fi
mkdir -p "$P"
exec 9>"$P/.lock"; flock 9
if [ -f "$STAMP" ]; then echo "$P"; exit 0; fi

rm -rf "$P"/{bin,images}
mkdir -p "$P"/{bin,images}
# shellcheck source=k8s-source.sh
. "$HERE/k8s-source.sh"
k8s_source "$P"

# The kubelet links the legacy in-tree image credential providers; the AWS one's Enabled() walks
# the AWS SDK credential chain at start-up, which dials the EC2 metadata address 169.254.169.254
# (`-tags providerless` does not remove it in 1.20). Unlink it; gcp/azure only read DMI or a file.
sed -i '\|_ "k8s.io/kubernetes/pkg/credentialprovider/aws"|d' cmd/kubelet/app/plugins.go
if grep -q credentialprovider/aws cmd/kubelet/app/plugins.go; then log "aws credential provider patch failed"; exit 1; fi

LD=$(k8s_ldflags)
# These three do not import pkg/generated/openapi: no openapi-gen step. -tags providerless: no
# in-tree cloud providers (and none of their metadata probes).
for c in kube-scheduler kube-proxy kubelet; do
  log "go build $c"
  nice go build -trimpath -tags providerless -ldflags "$LD" -o "$P/bin/$c" "./cmd/$c"
done

# pause: the upstream build/pause/linux/pause.c, static (musl), tagged as build/pause/Makefile says.
PAUSE_TAG=$(sed -n 's/^TAG = //p' build/pause/Makefile)
log "build pause $PAUSE_TAG (static)"
mkdir -p "$P/images/pause-root"
musl-gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-floe" -o "$P/images/pause-root/pause" build/pause/linux/pause.c
strip "$P/images/pause-root/pause"
python3 "$HERE/mkimage.py" "$P/images/pause.tar" "floe.local/pause:$PAUSE_TAG" "$P/images/pause-root" --entrypoint /pause >&2
echo "floe.local/pause:$PAUSE_TAG" > "$P/images/pause.name"
rm -rf "$P/images/pause-root"

"$P/bin/kubelet" --version >&2
# The toolchain, sources and GOPATH were only needed to build (the binaries are static).
rm -rf "$P/src" "$P/gopath" "$P/debs" "$P/apt" "$P/root"
touch "$STAMP"
log "done: $(ls "$P/bin" | tr '\n' ' ')"
echo "$P"
