#!/usr/bin/env bash
# Makes the plain user the rootless tests run as (issue 22): `reaperd-test`, with a home and
# ranges in /etc/subuid and /etc/subgid for rootless Podman's user namespace (Debian's
# uidmap provides newuidmap/newgidmap). Idempotent; it only ever creates or completes this
# one user, which the project owns. Prints the user's name.
set -euo pipefail
user=reaperd-test
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
