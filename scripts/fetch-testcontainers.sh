#!/usr/bin/env bash
# Fetches testcontainers-node from npm into a cache dir, for own_clients_test (a Node test
# that starts a network and two containers under `reaperctl run --own` and SIGKILLs itself).
# 10.28 is the newest line that runs on Debian's Node (18 in Debian 12; 12.x needs Node 22).
# npm 9+ runs no install scripts of the dependencies here (ssh2 and cpu-features only build
# optional native parts), so nothing is compiled.
#
# Idempotent: a cache whose module loads is left as it is. Prints one line naming the version.
#
#   scripts/fetch-testcontainers.sh
# Environment: REAPERD_TEST_CACHE (default /var/cache/reaperd-test); the module lives in
# $REAPERD_TEST_CACHE/npm/testcontainers-<version>/node_modules; the test finds it through the
# link $REAPERD_TEST_CACHE/npm/testcontainers.
set -euo pipefail

version=10.28.0
dir=${REAPERD_TEST_CACHE:-/var/cache/reaperd-test}/npm/testcontainers-$version

loads() { (cd "$dir" && node -e 'require("testcontainers")') >/dev/null 2>&1; }

if ! loads; then
  command -v npm >/dev/null || { echo "fetch-testcontainers: npm is missing (scripts/deps.sh installs it)" >&2; exit 1; }
  rm -rf "$dir"
  mkdir -p "$dir"
  echo '{"private": true}' >"$dir/package.json"
  if ! (cd "$dir" && npm install --no-audit --no-fund --ignore-scripts --loglevel=error "testcontainers@$version") \
      >"$dir.log" 2>&1; then
    echo "fetch-testcontainers: npm install testcontainers@$version failed:" >&2
    tail -20 "$dir.log" >&2
    exit 1
  fi
  loads || { ln -sfn "$(basename "$dir")" "$(dirname "$dir")/testcontainers"
echo "fetch-testcontainers: testcontainers@$version does not load with $(node --version)" >&2; exit 1; }
fi
ln -sfn "$(basename "$dir")" "$(dirname "$dir")/testcontainers"
echo "fetch-testcontainers: testcontainers $version on Node $(node --version) in $dir"
