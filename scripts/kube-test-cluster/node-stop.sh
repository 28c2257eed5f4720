#!/usr/bin/env bash
# Stop what node-start.sh started in STATE_DIR (stop.sh calls this when STATE_DIR holds a node): only PIDs recorded there, only containers of our
# private containerd, then undo host changes (netns, bridge, KUBE-* iptables chains, floe-knode
# chain/rules, kubepods cgroups, sysctls kubelet/kube-proxy changed). Finally the control plane.
D=$(realpath -m "${1:?usage: stop.sh STATE_DIR}")
HERE=$(cd "$(dirname "$0")" && pwd)
BRIDGE=floe0
SOCK=$D/containerd/containerd.sock
CTR=(ctr --address "$SOCK" -n k8s.io)
. "$HERE/pid-lib.sh"   # alive NAME, stop_pid NAME...: only processes started in $D

# 1. Node agents first (no graceful pod deletion: controllers would only recreate the pods).
stop_pid kube-proxy scheduler kubelet

# 2. Whatever is left in our containerd: kill tasks, remember their netns, delete containers.
NETNS=()
if alive containerd; then
  for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do
    ns=$("${CTR[@]}" containers info "$c" 2>/dev/null | python3 -c 'import json,sys
try:
  s=json.load(sys.stdin)["Spec"]["linux"]["namespaces"]
  print(next((n.get("path","") for n in s if n["type"]=="network"),""))
except Exception: pass')
    [ -n "$ns" ] && NETNS+=("$ns")
    "${CTR[@]}" tasks kill -s SIGKILL "$c" >/dev/null 2>&1
  done
  for _ in $(seq 1 20); do
    "${CTR[@]}" tasks ls 2>/dev/null | awk 'NR>1 && $3 != "STOPPED"' | grep -q . || break; sleep 0.2
  done
  for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do
    "${CTR[@]}" tasks delete -f "$c" >/dev/null 2>&1; "${CTR[@]}" containers delete "$c" >/dev/null 2>&1
  done
fi
stop_pid containerd
for ns in "${NETNS[@]}"; do
  case "$ns" in /proc/*) continue;; esac
  umount "$ns" 2>/dev/null; rm -f "$ns"
done
# No CNI DEL ran for killed pods: drop host-local leases, or the pool fills up over restarts.
rm -rf "$D/cni/ipam"
# Mounts left under the state dir (overlay rootfs, tmpfs volumes, shm), deepest first.
awk -v d="$D/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done

# 3. Host network state.
ip link del "$BRIDGE" 2>/dev/null
for t in iptables ip6tables; do
  command -v $t-save >/dev/null || continue
  if $t-save | grep -qE 'KUBE-|floe-knode'; then
    $t-save | grep -vE 'KUBE-|floe-knode' | $t-restore 2>/dev/null || echo "stop.sh: $t cleanup failed" >&2
  fi
done

# 4. kubepods cgroups (cgroupfs driver), deepest first; only empty ones can go.
for h in /sys/fs/cgroup/*/; do
  [ -d "$h/kubepods" ] && find "$h/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
done

# 5. Sysctls back to what they were before start.sh.
if [ -f "$D/sysctl.orig" ]; then
  while IFS= read -r kv; do sysctl -q -w "$kv" >/dev/null 2>&1; done < "$D/sysctl.orig"
fi

# 6. The control plane.
"$HERE/stop.sh" "$D/cp"
true
