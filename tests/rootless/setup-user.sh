#!/usr/bin/env bash
# Makes a plain user the rootless tests run as (issue 22): `reaperd-test` (the default) or
# `reaperd-test2` (the second user of two_users.sh), with a home and ranges in /etc/subuid and
# /etc/subgid for rootless Podman's user namespace (Debian's uidmap provides
# newuidmap/newgidmap). Idempotent; it only ever creates or completes these users, which the
# project owns. Prints the user's name.
# Usage: setup-user.sh [reaperd-test|reaperd-test2]
set -euo pipefail
user=${1:-reaperd-test}
case "$user" in
  reaperd-test | reaperd-test2) ;;
  *) echo "usage: $0 [reaperd-test|reaperd-test2]" >&2; exit 64 ;;
esac
if ! id "$user" >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash --comment "reaperd rootless tests" "$user"
fi
# useradd may have given ranges already (SUB_UID_COUNT in login.defs); else the first free
# 65536 ids from 200000 on.
for file in /etc/subuid /etc/subgid; do
  touch "$file"
  if ! grep -q "^$user:" "$file"; then
    start=200000
    while read -r line; do
      IFS=: read -r _ first count <<<"$line"
      [ -n "$first" ] && ((first + count > start)) && start=$((first + count))
    done <"$file"
    echo "$user:$start:65536" >>"$file"
  fi
done
echo "$user"
