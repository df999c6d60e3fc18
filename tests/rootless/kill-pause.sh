#!/usr/bin/env bash
# Stops the "podman pause" process of one rootless run. Rootless Podman keeps its user
# namespace in that process, which outlives the service and whose command line names no dir
# (9 were left after one suite, 14 after a day's runs); it is known by its environment: the
# run's own XDG_RUNTIME_DIR, which no other process of the user has. SIGKILL, by pid.
# Usage: kill-pause.sh USER XDG_RUNTIME_DIR
set -uo pipefail
user=$1 runtime=$2
for p in $(pgrep -u "$user" 2>/dev/null); do
  if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "XDG_RUNTIME_DIR=$runtime"; then
    kill -KILL "$p" 2>/dev/null
  fi
done
exit 0
