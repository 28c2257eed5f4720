#!/usr/bin/env bash
# Stop what start.sh started in STATE_DIR, by recorded PID only.
D=${1:?usage: stop.sh STATE_DIR}
# A node's state dir (start.sh --node) holds the control plane under cp/.
if [ -d "$D/cp" ]; then exec "$(dirname "$0")/node-stop.sh" "$D"; fi
for p in kcm apiserver etcd; do
  if [ -f "$D/$p.pid" ]; then
    pid=$(cat "$D/$p.pid")
    kill "$pid" 2>/dev/null && for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    rm -f "$D/$p.pid"
  fi
done
true
