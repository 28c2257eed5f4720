# Sourced by setup.sh and node-setup.sh (not run): the Kubernetes source tree both build from.
#
#   k8s_source DIR [DEB...]
#
# Downloads Debian's Go 1.19, Go's sources, modern-go/reflect2 1.0.2 and the extra DEBs, and
# extracts them under DIR/root; fetches Debian's `kubernetes` source package into DIR/src
# (through a private deb-src list built from the mirror apt is already configured with: no host
# name in the repo); exports a GOPATH-mode Go environment (offline, static, Go's build cache in
# $CACHE/gocache); cd's into the tree and applies the fix every build needs. Expects
# K8S_DEB_VERSION, K8S_VERSION, CACHE and log() from the caller.
k8s_source() {
  local dir=$1; shift
  rm -rf "$dir"/{debs,root,src,apt,gopath}
  mkdir -p "$dir"/{debs,root,src,apt/lists/partial}
  local debs=(golang-1.19-go golang-1.19-src golang-github-modern-go-reflect2-dev "$@")
  log "fetch ${debs[*]} (.deb, extracted under $dir/root)"
  if ! (cd "$dir/debs" && apt-get download -q "${debs[@]}" >/dev/null 2>&1); then
    log "apt lists look stale: apt-get update"
    apt-get update -qq >/dev/null 2>&1 || true
    (cd "$dir/debs" && apt-get download -q "${debs[@]}" >/dev/null 2>&1) || { log "apt-get download failed"; return 1; }
  fi
  local d
  for d in "$dir"/debs/*.deb; do dpkg-deb -x "$d" "$dir/root"; done

  log "fetch kubernetes $K8S_DEB_VERSION source package (private deb-src list)"
  local mirror
  mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Identifier: Packages' 'Origin: Debian' 'Codename: bookworm' | head -1)
  [ -n "$mirror" ] || { log "no Debian bookworm mirror in apt's configuration"; return 1; }
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main" > "$dir/apt/sources.list"
  local aptopt=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent -o "Dir::State::Lists=$dir/apt/lists")
  apt-get "${aptopt[@]}" update -qq >/dev/null 2>&1
  (cd "$dir/src" && apt-get "${aptopt[@]}" source --download-only "kubernetes=$K8S_DEB_VERSION" >/dev/null 2>&1 \
    && tar xzf "kubernetes_1.20.5+really${K8S_VERSION}.orig.tar.gz") || { log "kubernetes source download failed"; return 1; }

  export PATH=$dir/root/usr/lib/go-1.19/bin:$PATH GOCACHE=$CACHE/gocache GOPATH=$dir/gopath \
    GOPROXY=off GO111MODULE=off CGO_ENABLED=0 GOFLAGS=
  mkdir -p "$GOPATH/src/k8s.io"
  ln -sfn "$dir/src/kubernetes-$K8S_VERSION" "$GOPATH/src/k8s.io/kubernetes"
  cd "$GOPATH/src/k8s.io/kubernetes" || return 1

  # The vendored modern-go/reflect2 1.0.1 segfaults on Go >= 1.18; Debian ships 1.0.2.
  log "patch vendored modern-go/reflect2 1.0.1 -> 1.0.2"
  local r=vendor/github.com/modern-go/reflect2
  rm -f $r/*.go $r/*.s
  cp "$dir"/root/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} $r/
  rm -f $r/*_test.go
}

# The -ldflags of every build: stripped, with the version `kubectl version` and the apiserver
# report (a source tarball has no git metadata).
k8s_ldflags() {
  local ld="-s -w" v
  for v in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    ld="$ld -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=20 -X $v.gitTreeState=archive"
  done
  echo "$ld"
}
