#!/usr/bin/env bash
# A genuine one-node cluster in STATE_DIR (root only): the control plane of start.sh, plus
#   node    : containerd (private config/root/socket) + runc, bridge CNI (host-local IPAM),
#             kubelet (cgroupfs, CRI remote), kube-scheduler, kube-proxy (iptables mode)
#   images  : floe.local/pause:<tag> (node-setup.sh); load more with images.sh
#
#   node-start.sh STATE_DIR   (or start.sh --node STATE_DIR) -> prints STATE_DIR/kubeconfig once
#                             the Node is Ready (~25 s; a live STATE_DIR is reused in < 1 s)
#   stop.sh STATE_DIR         -> stops the recorded PIDs, removes netns/bridge/iptables chains
#
# Env: POD_CIDR (default 10.244.0.0/24: the host gets .1 on bridge floe0, pods .2 and up)
#      FLOE_NODE_HOST_PORTS  host TCP ports pods may reach on the bridge address (e.g. a model
#                            server the test forwards there); every other host port is closed
#      The apiserver always listens on the bridge address too (pods use in-cluster config:
#      the chart's operator), and the kubelet sends pods to a cluster DNS on the bridge
#      address, port 53 (tests serve it: tests/src/cluster_dns.rs).
# Network safety: pods get no default route (isGateway=false, no ipMasq), only the pod subnet and
# a route for the service CIDR via the host; the host forwards only from the bridge back onto it.
# What each fix below is for: docs/testing.md ("The real node").
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(realpath -m "${1:?usage: start.sh STATE_DIR}")
POD_CIDR=${POD_CIDR:-10.244.0.0/24}
SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/24}   # must match kube-apiserver --service-cluster-ip-range
BRIDGE=floe0
[ "$(id -u)" = 0 ] || { echo "start.sh: must run as root" >&2; exit 1; }
mkdir -p "$D"
exec 8>"$D/.knode.lock"   # one start.sh per STATE_DIR at a time (children get 8>&-)
flock 8
log() { echo "[knode $(date +%T)] $*" >&2; }
. "$HERE/pid-lib.sh"   # alive NAME: the process recorded in $D/NAME.pid still runs
t0=$(date +%s%N)
ms() { echo $(( ($(date +%s%N) - t0) / 1000000 )); }

P=$("$HERE/node-setup.sh")
BIN=$P/bin

# --- remember sysctls kubelet/kube-proxy change, so stop.sh can restore them ---
if [ ! -f "$D/sysctl.orig" ]; then
  for s in kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom \
           kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.conf.all.route_localnet net.ipv4.ip_forward; do
    echo "$s=$(sysctl -n "$s")"
  done > "$D/sysctl.orig"
fi

# --- CNI: bridge + host-local, host gets the first address on the bridge ---
mkdir -p "$D/cni/net.d" "$D/cni/ipam"
HOST_IP=$(python3 -c "import ipaddress,sys; print(next(ipaddress.ip_network(sys.argv[1]).hosts()))" "$POD_CIDR")
PREFIX=${POD_CIDR#*/}
NODE_NAME=${NODE_NAME:-$HOST_IP}
cat > "$D/cni/net.d/10-floe.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "floe",
 "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$HOST_IP"}]],
            "routes": [{"dst": "$SERVICE_CIDR", "gw": "$HOST_IP"}], "dataDir": "$D/cni/ipam"}}
 ]}
JSON
ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
addrs=$(ip -o addr show dev "$BRIDGE")   # (no `| grep -q` under pipefail: SIGPIPE)
[[ "$addrs" == *" $HOST_IP/"* ]] || ip addr add "$HOST_IP/$PREFIX" dev "$BRIDGE"
# No IPv6 address for the host on the bridge: pods reach the host over IPv4 only (filtered below).
[ -e "/proc/sys/net/ipv6/conf/$BRIDGE/disable_ipv6" ] && sysctl -q -w "net.ipv6.conf.$BRIDGE.disable_ipv6=1"
ip link set "$BRIDGE" up
# Pod -> ClusterIP needs the host to route (DNAT in PREROUTING, then forward back onto the bridge):
# ip_forward=1, guarded in mangle/FORWARD (before kube-proxy's
# filter/KUBE-FORWARD accepts) so nothing is forwarded into or out of the bridge, only within it.
# Always on: sessions ship to the collector's and the trainer's Services.
if true; then
  for r in "-i $BRIDGE ! -o $BRIDGE" "! -i $BRIDGE -o $BRIDGE"; do
    # shellcheck disable=SC2086
    iptables -t mangle -C FORWARD $r -m comment --comment floe-knode -j DROP 2>/dev/null \
      || iptables -t mangle -A FORWARD $r -m comment --comment floe-knode -j DROP
  done
  sysctl -q -w net.ipv4.ip_forward=1
fi

# --- control plane (reused if alive) ---
KUBECTL_BIN=$("$HERE/setup.sh")/kubectl
# The apiserver on the bridge address, with ServiceAccount tokens: pods can use in-cluster config.
KC=$(KAPI_BIND_IP=$HOST_IP "$HERE/start.sh" "$D/cp" 8>&-)
log "control plane up ($(ms) ms)"

# --- containerd (private root/state/socket; CRI plugin uses our CNI conf dir) ---
C=$D/containerd
SOCK=$C/containerd.sock
[ ${#SOCK} -lt 100 ] || { log "socket path too long: $SOCK"; exit 1; }
PAUSE_IMAGE=$(cat "$P/images/pause.name")
mkdir -p "$C"
cat > "$C/config.toml" <<TOML
version = 2
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$C/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    # No CAP_SYS_RESOURCE here: negative oom_score_adj (pause -998, Guaranteed -997) fails in runc
    # ("can't get final child's PID from pipe: EOF"); clamp to containerd's own score instead.
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$D/cni/net.d"
      max_conf_num = 1
TOML
CTR=(ctr --address "$SOCK" -n k8s.io)
if ! alive containerd; then
  containerd --config "$C/config.toml" > "$D/containerd.log" 2>&1 8>&- &
  echo $! > "$D/containerd.pid"
  for _ in $(seq 1 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
  "${CTR[@]}" version >/dev/null || { log "containerd failed:"; tail -20 "$D/containerd.log" >&2; exit 1; }
fi
have=$("${CTR[@]}" images ls -q)
for img in pause; do
  grep -qx "$(cat "$P/images/$img.name")" <<<"$have" || "${CTR[@]}" images import "$P/images/$img.tar" >/dev/null
done
log "containerd up, images imported ($(ms) ms)"

# --- pods -> host: replies, the apiserver, cluster DNS and FLOE_NODE_HOST_PORTS only ---
# The bridge address makes every host service bound to 0.0.0.0 reachable from pods, and the
# kubelet serves there (anonymous + AlwaysAllow). Chain floe-knode-input drops all other new
# connections from the bridge.
iptables -N floe-knode-input 2>/dev/null || true
iptables -F floe-knode-input
iptables -A floe-knode-input -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
for port in "$(cat "$D/cp/port")" ${FLOE_NODE_HOST_PORTS:-}; do
  iptables -A floe-knode-input -p tcp -d "$HOST_IP" --dport "$port" -j ACCEPT
done
iptables -A floe-knode-input -p udp -d "$HOST_IP" --dport 53 -j ACCEPT
iptables -A floe-knode-input -j DROP
iptables -C INPUT -i "$BRIDGE" -j floe-knode-input 2>/dev/null || iptables -I INPUT -i "$BRIDGE" -j floe-knode-input

# --- kubelet ---
# The node IP must not be loopback (kubelet refuses it, then the Node has no address and
# `kubectl logs/exec` cannot reach the kubelet), so kubelet serves on the bridge's host IP.
K=$D/kubelet
mkdir -p "$K"
KUBELET_STARTED=$(cat "$K/started" 2>/dev/null || echo 0)
if ! alive kubelet; then
  KUBELET_STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ); echo "$KUBELET_STARTED" > "$K/started"
  # --eviction-hard in bytes, not percent: on a large, shared disk 2% is gigabytes, and under it
  # the kubelet deletes "unused" images to reclaim space (the node's images are imported, no
  # registry can give them back), so every later pod waits forever. Seen in CI with 5 GB free.
  # --kube-api-qps/burst: kubelet >= 1.27's defaults (50/100). At 1.20's 5/10 a busy node's pod
  # status reached the apiserver seconds late (a pool pod's Ready ~4 s after the kubelet saw it).
  AWS_EC2_METADATA_DISABLED=true "$BIN/kubelet" --kubeconfig="$KC" --hostname-override="$NODE_NAME" --node-ip="$HOST_IP" \
    --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" --runtime-request-timeout=5m \
    --cgroup-driver=cgroupfs --fail-swap-on=false \
    --root-dir="$K/root" --cert-dir="$K/pki" --volume-plugin-dir="$K/volume-plugins" \
    --address="$HOST_IP" --port=10250 --read-only-port=0 --healthz-bind-address=127.0.0.1 \
    --anonymous-auth=true --authorization-mode=AlwaysAllow \
    --pod-infra-container-image="$PAUSE_IMAGE" --resolv-conf= \
    --cluster-dns="$HOST_IP" --cluster-domain=cluster.local \
    --eviction-hard='memory.available<100Mi,nodefs.available<512Mi,imagefs.available<512Mi' \
    --kube-api-qps=50 --kube-api-burst=100 \
    --image-gc-high-threshold=100 --image-gc-low-threshold=99 \
    --v=2 >> "$D/kubelet.log" 2>&1 8>&- &   # appended: a restarted kubelet's log follows the last
  echo $! > "$D/kubelet.pid"
fi

# --- kube-scheduler ---
if ! alive scheduler; then
  "$BIN/kube-scheduler" --kubeconfig="$KC" --leader-elect=false --port=0 --secure-port=0 \
    --v=1 > "$D/scheduler.log" 2>&1 8>&- &
  echo $! > "$D/scheduler.pid"
fi

# --- kube-proxy (iptables mode; no conntrack sysctl changes; NodePorts only on loopback) ---
if ! alive kube-proxy; then
  "$BIN/kube-proxy" --kubeconfig="$KC" --hostname-override="$NODE_NAME" --proxy-mode=iptables \
    --cluster-cidr="$POD_CIDR" --bind-address=127.0.0.1 --healthz-bind-address=127.0.0.1:10256 \
    --metrics-bind-address=127.0.0.1:10249 --nodeport-addresses=127.0.0.0/8 \
    --conntrack-max-per-core=0 --conntrack-min=0 --conntrack-tcp-timeout-established=0 \
    --conntrack-tcp-timeout-close-wait=0 --v=1 > "$D/kube-proxy.log" 2>&1 8>&- &
  echo $! > "$D/kube-proxy.pid"
fi

ln -sf "$KUBECTL_BIN" "$D/kubectl"
ln -sf "$KC" "$D/kubeconfig"
# Ready only counts if this kubelet reported it (a reused etcd keeps the old Node object).
node_ready() {
  local r; r=$("$D/kubectl" --kubeconfig "$KC" get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
  [ "${r% *}" = True ] && [[ ! "${r#* }" < "$KUBELET_STARTED" ]]
}
for _ in $(seq 1 240); do
  node_ready && break
  for c in containerd kubelet scheduler; do running $c || { log "$c exited:"; tail -20 "$D/$c.log" >&2; exit 1; }; done
  sleep 0.5
done
node_ready || { log "node $NODE_NAME not Ready after 120 s"; tail -30 "$D/kubelet.log" >&2; exit 1; }
# What tests read back: where pods reach the host, and which host ports they may.
echo "$HOST_IP" > "$D/host-ip"
echo "${FLOE_NODE_HOST_PORTS:-}" > "$D/host-ports"
log "node $NODE_NAME Ready in $(ms) ms"
echo "$KC"
