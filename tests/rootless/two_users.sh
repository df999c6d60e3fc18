#!/usr/bin/env bash
# Two users' rootless engines and reaperds side by side (issue 22, point 7), as root:
# tests/rootless/run.sh as `reaperd-test` and as `reaperd-test2` at the same time, each with its
# own engine, reaperd, socket and state, and the same session and container names in both (s1,
# s2, live; outsider, other-session, pinned). Each user's reaperd reaps its own ended sessions,
# the orphan whose delete failed included, and leaves its live ones and its unlabelled
# container, whatever the other's does at that moment; each user is refused at the other's
# control socket. The runaway log is left to the first user (run.sh's own test has it): two
# `yes` writers at once keep both cores busy. The engine is run.sh's: podman (the default) or
# docker (REAPER_TEST_ENGINE picks its release, as for run.sh).
# Usage: two_users.sh REAPERD REAPERCTL [podman|docker]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
engine=${3:-podman}
case "$engine" in
  podman | docker) ;;
  *) echo "usage: $0 REAPERD REAPERCTL [podman|docker]" >&2; exit 64 ;;
esac
first=$("$here/setup-user.sh" reaperd-test)
second=$("$here/setup-user.sh" reaperd-test2)
REAPER_ROOTLESS_USER=$first REAPER_ROOTLESS_OTHER_USER=$second \
  "$here/run.sh" "$1" "$2" "$engine" > >(sed -u "s/^/$first: /") 2>&1 &
first_pid=$!
REAPER_ROOTLESS_USER=$second REAPER_ROOTLESS_OTHER_USER=$first REAPER_ROOTLESS_RUNAWAY=0 \
  "$here/run.sh" "$1" "$2" "$engine" > >(sed -u "s/^/$second: /") 2>&1 &
second_pid=$!
status=0
wait "$first_pid" || status=1
wait "$second_pid" || status=1
# The prefixing seds end with their writers' output; let them print the last lines.
sleep 0.2
echo "two users ($engine): $([ "$status" = 0 ] && echo passed || echo failed)"
exit "$status"
