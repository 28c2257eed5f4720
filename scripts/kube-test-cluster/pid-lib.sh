# Sourced by start.sh, stop.sh, node-start.sh and node-stop.sh (not run): the PIDs they record
# in a state dir $D. A PID file outlives a killed run, and PIDs wrap within a CI run (pid_max
# is 32768 on the machines this runs on), so a recorded PID counts only while its process's
# command line names the state dir: every process these scripts start takes a path in it.
# Nobody else's process is ever signalled. A zombie's command line is empty: not alive either.

# recorded_pid NAME: print the PID in $D/NAME.pid if that process is still the one started.
recorded_pid() {
  local pid cmdline
  pid=$(cat "$D/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"$D/"* ]] || return 1
  echo "$pid"
}
alive() { recorded_pid "$1" > /dev/null; }

# running NAME: the process this script has just started in the background still runs. Between
# its fork and its exec its command line is the script's own, which names the state dir without
# a `/` after it, so `alive` said no: under load the first check came before etcd's exec, and a
# healthy start failed as "etcd exited" with an empty log. Only for a PID recorded moments ago
# by the caller itself (no wrap to fear); a zombie, exited and not yet reaped, is not running.
running() {
  local pid state
  pid=$(cat "$D/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# stop_pid NAME...: SIGTERM those still running at once, wait up to 5 s in all, SIGKILL the rest;
# their PID files go either way.
stop_pid() {
  local n pid pids=()
  for n in "$@"; do pid=$(recorded_pid "$n") && pids+=("$pid"); done
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pids[@]}" 2>/dev/null
  fi
  for n in "$@"; do rm -f "$D/$n.pid"; done
  return 0
}
