#!/usr/bin/env bash
# The second test command: reaperd's .deb under a real systemd (PID 1 in a container of a
# private engine): start only after READY, a reap in `journalctl -u reaperd`, a watchdog
# restart after SIGSTOP, a broken reload that keeps the old config, a clean stop; then the
# user unit under a lingering user's manager.
# Too slow for every `ctest` run (building the .deb and booting systemd); CI runs it after
# the main suite. The first run on a machine also debootstraps a bookworm root file system
# into $REAPERD_TEST_CACHE (default /var/cache/reaperd-test), which takes a few minutes.
# Usage: scripts/test-systemd.sh   (as root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" build test systemd
deb=$("$root/packaging/build-deb.sh" "${REAPERD_DEB_BUILD_DIR:-$root/build-deb}" | tail -n 1)
echo "package: $deb"
exec "$root/tests/systemd/run.sh" "$deb"
