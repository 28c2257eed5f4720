#!/usr/bin/env bash
# Stop what start.sh started in STATE_DIR, by recorded PID only.
D=$(realpath -m "${1:?usage: stop.sh STATE_DIR}")
HERE=$(cd "$(dirname "$0")" && pwd)
# A node's state dir (start.sh --node) holds the control plane under cp/.
if [ -d "$D/cp" ]; then exec "$HERE/node-stop.sh" "$D"; fi
. "$HERE/pid-lib.sh"
stop_pid kcm apiserver etcd
