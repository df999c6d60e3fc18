#!/usr/bin/env bash
# Checks systemd/reaperd.service offline, as issue 6 asks:
#   - `systemd-analyze verify` prints nothing on stderr (it exits 0 even on parse errors,
#     so stderr is what counts);
#   - `systemd-analyze security --offline=true` scores its exposure at most 1.5.
# verify also checks that ExecStart's binary exists and is executable: the built reaperd is
# laid over /usr/bin in a private mount namespace (an overlay; the host's /usr/bin is untouched).
# With a third argument `--user`, the unit is a user unit (systemd/user/reaperd.service,
# issue 22), checked as the user manager would load it (`systemd-analyze --user`, which needs
# an XDG_RUNTIME_DIR: a private temp one).
# Usage: unit_check.sh UNIT_FILE REAPERD_BINARY [--user]
set -euo pipefail
unit=$1
reaperd=$2
scope=${3:-}
max_exposure=1.5

work=$(mktemp -d /tmp/reaperd-unit-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ "$scope" = --user ]; then
  mkdir -m 0700 "$work/runtime"
  export XDG_RUNTIME_DIR=$work/runtime
fi

unshare --mount --propagation private bash -c '
  set -e
  work=$1 unit=$2 reaperd=$3 scope=$4
  mount -n -t tmpfs tmpfs "$work"
  if [ -n "$scope" ]; then mkdir -m 0700 "$work/runtime"; fi
  mkdir "$work/upper" "$work/work"
  cp "$reaperd" "$work/upper/reaperd"
  mount -n -t overlay overlay \
    -o "lowerdir=/usr/bin,upperdir=$work/upper,workdir=$work/work" /usr/bin
  systemd-analyze $scope verify --man=no "$unit" >"$work/verify.out" 2>"$work/verify.err" || true
  cat "$work/verify.err" >&2
  [ ! -s "$work/verify.err" ]
' unit-check "$work" "$unit" "$reaperd" "$scope" && verify_ok=1 || verify_ok=0
if ((verify_ok)); then
  echo "verify: no diagnostics"
else
  echo "FAIL: systemd-analyze verify printed diagnostics (above)"
fi

security=$(systemd-analyze $scope security --offline=true --no-pager "$unit" 2>&1) || true
exposure=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<<"$security")
if [ -z "$exposure" ]; then
  echo "$security"
  echo "FAIL: no exposure level in systemd-analyze security's output"
  exit 1
fi
echo "security: exposure $exposure (at most $max_exposure allowed)"
exposure_ok=$(awk -v e="$exposure" -v m="$max_exposure" 'BEGIN { print (e <= m) ? 1 : 0 }')
if ((!exposure_ok)); then
  grep -E '^[✗~]' <<<"$security" || true
  echo "FAIL: exposure $exposure > $max_exposure"
fi
# The same limit through systemd's own switch (0-100 scale).
if ! systemd-analyze $scope security --offline=true --threshold=15 --no-pager "$unit" >/dev/null 2>&1; then
  echo "FAIL: systemd-analyze security --threshold=15 rejects the unit"
  exposure_ok=0
fi

if ((verify_ok && exposure_ok)); then echo "unit_check: passed"; else exit 1; fi
