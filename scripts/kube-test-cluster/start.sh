#!/usr/bin/env bash
# Start (or reuse) a genuine local control plane in STATE_DIR: etcd 3.4 + kube-apiserver and
# kube-controller-manager v1.20.2 (built by setup.sh), on free loopback ports, with a throwaway
# CA, a static admin token and RBAC. Writes STATE_DIR/kubeconfig and prints its path.
#
#   start.sh STATE_DIR         # ~5 s; idempotent: a live control plane in STATE_DIR is reused
#   start.sh --node STATE_DIR  # ...and a genuine node beside it (node-start.sh: kubelet,
#                              # containerd, kube-scheduler, kube-proxy; root only, ~25 s)
#   stop.sh STATE_DIR          # stops only the PIDs recorded here (and the node, if any)
#
# Without --node there is no kubelet and no container runtime: tests play the kubelet's role.
# KAPI_BIND_IP=ADDR (node-start.sh sets it for pods that use in-cluster config): the apiserver
# listens on ADDR instead of 127.0.0.1, its certificate also names ADDR and the `kubernetes`
# Service address, and ServiceAccount tokens are issued.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --node ]; then shift; exec "$HERE/node-start.sh" "$@"; fi
D=$(realpath -m "${1:?usage: start.sh STATE_DIR}")
BIND=${KAPI_BIND_IP:-127.0.0.1}
mkdir -p "$D"
exec 9>"$D/.lock"
flock 9

log() { echo "[kapi $(date +%T)] $*" >&2; }
. "$HERE/pid-lib.sh"   # alive NAME: the process recorded in $D/NAME.pid still runs
ready() {
  [ -f "$D/port" ] && curl -sf --max-time 2 --cacert "$D/ca.crt" -H "Authorization: Bearer $(cat "$D/token")" \
    "https://$BIND:$(cat "$D/port")/readyz" >/dev/null 2>&1
}

if alive etcd && alive apiserver && ready; then
  echo "$D/kubeconfig"; exit 0
fi
"$HERE/stop.sh" "$D" >/dev/null 2>&1 || true

BIN=${KAPI_BIN:-$("$HERE/setup.sh")}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

if [ ! -f "$D/ca.crt" ]; then
  openssl genrsa -out "$D/sa.key" 2048 2>/dev/null
  openssl rsa -in "$D/sa.key" -pubout -out "$D/sa.pub" 2>/dev/null
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$D/ca.key" -out "$D/ca.crt" -days 3650 -subj /CN=floe-test-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$D/serving.key" -out "$D/serving.csr" -subj /CN=kube-apiserver 2>/dev/null
  SAN="IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  # 10.96.0.1: the `kubernetes` Service's address in --service-cluster-ip-range below.
  [ "$BIND" = 127.0.0.1 ] || SAN="$SAN,IP:$BIND,IP:10.96.0.1"
  printf "subjectAltName=%s\nextendedKeyUsage=serverAuth\n" "$SAN" > "$D/san.ext"
  openssl x509 -req -in "$D/serving.csr" -CA "$D/ca.crt" -CAkey "$D/ca.key" -CAcreateserial \
    -out "$D/serving.crt" -days 3650 -extfile "$D/san.ext" 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$D/token"
  echo "$(cat "$D/token"),floe-test-admin,1,system:masters" > "$D/tokens.csv"
fi

# The apiserver keeps its port across restarts in DIR when it is free: etcd keeps the
# `kubernetes` Endpoints, which in-cluster clients are sent to, and 1.20 does not rewrite a
# stale port there.
PORT=$(cat "$D/port" 2>/dev/null || true)
if [ -z "$PORT" ] || ! python3 -c 'import socket,sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$PORT" 2>/dev/null; then
  PORT=$(free_port)
fi
# Three ports asked for one after another: each was free when asked, and the kernel may hand
# one back twice (etcd then dies at once binding its second, as a run saw once: "etcd exited").
ETCD_PORT=$(free_port); ETCD_PEER=$(free_port)
while [ "$ETCD_PORT" = "$PORT" ]; do ETCD_PORT=$(free_port); done
while [ "$ETCD_PEER" = "$PORT" ] || [ "$ETCD_PEER" = "$ETCD_PORT" ]; do ETCD_PEER=$(free_port); done
echo "$PORT" > "$D/port"
cat > "$D/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: floe-test
  cluster: {server: "https://$BIND:$PORT", certificate-authority: "$D/ca.crt"}
contexts:
- name: floe-test
  context: {cluster: floe-test, user: admin, namespace: default}
current-context: floe-test
users:
- name: admin
  user: {token: $(cat "$D/token")}
KC

t0=$(date +%s%N)
"$BIN/etcd" --name floe-test --data-dir "$D/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "floe-test=http://127.0.0.1:$ETCD_PEER" --log-level warn > "$D/etcd.log" 2>&1 9>&- &
echo $! > "$D/etcd.pid"
# apiserver 1.20 refuses --insecure-port != 0: TLS with our CA and a static admin token.
# Without in-cluster clients no pod needs a ServiceAccount token: the admission plugin is off.
SA_ADMISSION=(--disable-admission-plugins=ServiceAccount)
[ "$BIND" = 127.0.0.1 ] || SA_ADMISSION=()
"$BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --insecure-port=0 --secure-port="$PORT" --bind-address="$BIND" --advertise-address="$BIND" \
  --tls-cert-file="$D/serving.crt" --tls-private-key-file="$D/serving.key" --client-ca-file="$D/ca.crt" \
  --token-auth-file="$D/tokens.csv" --anonymous-auth=false --authorization-mode=RBAC \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$D/sa.pub" \
  --service-account-signing-key-file="$D/sa.key" --api-audiences=https://kubernetes.default.svc \
  --service-cluster-ip-range=10.96.0.0/24 \
  "${SA_ADMISSION[@]}" --v=1 > "$D/apiserver.log" 2>&1 9>&- &
echo $! > "$D/apiserver.pid"
for _ in $(seq 1 300); do
  ready && break
  running apiserver || { log "kube-apiserver exited:"; tail -20 "$D/apiserver.log" >&2; exit 1; }
  running etcd || { log "etcd exited:"; tail -20 "$D/etcd.log" >&2; exit 1; }
  sleep 0.2
done
ready || { log "kube-apiserver not ready after 60 s"; tail -20 "$D/apiserver.log" >&2; exit 1; }
# kube-controller-manager runs garbage collection (ownerReferences) and namespace deletion.
"$BIN/kube-controller-manager" --kubeconfig="$D/kubeconfig" --leader-elect=false \
  --service-account-private-key-file="$D/sa.key" --root-ca-file="$D/ca.crt" --use-service-account-credentials=false \
  --port=0 --secure-port=0 --controllers='*' --v=1 > "$D/kcm.log" 2>&1 9>&- &
echo $! > "$D/kcm.pid"
log "ready in $(( ($(date +%s%N) - t0) / 1000000 )) ms on $BIND:$PORT"
echo "$D/kubeconfig"
