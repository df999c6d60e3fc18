#!/usr/bin/env bash
# Runs the integration tests against one of the real current Dockers, on a fresh Debian 12
# machine as root: fetches it (scripts/fetch-engines.sh: Debian 13's Docker 26.1 for
# docker-trixie, Debian unstable's for docker-sid, each with its CLI and Compose v2; the host's
# apt sources untouched), builds as scripts/test.sh does, and runs every integration test with
# REAPER_TEST_ENGINE=<engine>, each process on its own private dockerd of that release
# (tests/harness/engine-guard, stopped by its pid). The first line names the engine's version.
# Unstable moves: when docker-sid no longer fetches or runs here, this says exactly that and
# exits 0 without running; docker-trixie is required.
# docker-rootless: each private dockerd run rootless as the plain user reaperd-test through the
# engine's own dockerd-rootless.sh (tests/harness/engine-guard with REAPER_DOCKER_ROOTLESS=1),
# against the integration tests' engine-neutral cases (the ones the Podman stages run;
# tests/CMakeLists.txt): Debian 12's own Docker 20.10, or with --engine trixie|sid the fetched
# Docker 26.1 or 28.5 (sid: skipped, as above, when unavailable), and then also the plain user's
# own rootless Docker with the XDG defaults, alone and two users side by side
# (tests/rootless/run.sh, two_users.sh; on 20.10 those are the main suite's rootless tests).
#
#   scripts/test-engine.sh docker-trixie|docker-sid [--build DIR] [-- CTEST_ARGS...]
#   scripts/test-engine.sh docker-rootless [--engine trixie|sid] [--build DIR] [-- CTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 docker-trixie|docker-sid|docker-rootless [--engine trixie|sid] [--build DIR] [-- CTEST_ARGS...]" >&2
  exit 64
}
engine=${1:-}
case "$engine" in
  docker-trixie | docker-sid | docker-rootless) shift ;;
  *) usage ;;
esac
build=build
rootless_suite=""
ctest_flags=()
while (($#)); do
  case "$1" in
    --build) build=$2; shift ;;
    --engine)
      [ "$engine" = docker-rootless ] || usage
      case "${2:-}" in trixie | sid) rootless_suite=$2 ;; *) usage ;; esac
      shift ;;
    --) shift; ctest_flags+=("$@"); break ;;
    *) usage ;;
  esac
  shift
done
if [ "$engine" = docker-rootless ]; then suite=$rootless_suite; else suite=${engine#docker-}; fi
cache=${REAPERD_TEST_CACHE:-/var/cache/reaperd-test}/engines/$suite

scripts/deps.sh
if [ -n "$suite" ]; then
  [ "$engine" = docker-rootless ] || scripts/fetch-testcontainers.sh  # own_clients_test runs testcontainers-node
  scripts/fetch-engines.sh "$suite"
  if [ -e "$cache/unavailable" ]; then
    echo "test-engine: $engine${rootless_suite:+ $rootless_suite}: SKIPPED, the engine is unavailable on this machine: $(cat "$cache/unavailable")"
    exit 0
  fi
fi
if [ "$engine" = docker-rootless ]; then
  # The harness runs the fetched engine (REAPER_TEST_ENGINE) rootless (the generated CTest
  # file sets REAPER_DOCKER_ROOTLESS=1); without --engine, Debian 12's, whatever the caller's
  # environment says.
  if [ -n "$suite" ]; then export REAPER_TEST_ENGINE=docker-$suite; else unset REAPER_TEST_ENGINE; fi
  echo "test-engine: $engine: $(PATH=${suite:+$cache/root/usr/sbin:$cache/root/usr/bin:}$PATH dockerd --version)," \
    "rootless as reaperd-test, $(rootlesskit --version), $(slirp4netns --version | head -1)"
else
  echo "test-engine: $engine: $(cat "$cache/versions")"
fi

export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)"

export REAPER_TEST_RUN=run$$
status=0
# Debian 12's rootless Docker as the plain user, and two users', are the main suite's
# rootless_docker_test and rootless_two_users_docker_test.
[ "$engine" = docker-rootless ] && [ -z "$suite" ] &&
  ctest_flags=(-E '^docker-rootless\.rootless_(docker|two_users)_test$' "${ctest_flags[@]}")
ctest --test-dir "$build/tests/engine-$engine" --output-on-failure -j2 "${ctest_flags[@]}" || status=$?

left=$(pgrep -af -- "--data-root /tmp/reaper-engine\.$REAPER_TEST_RUN\." || true)
if [ -n "$left" ]; then
  echo "test-engine.sh: engines left running by the tests:" >&2
  echo "$left" >&2
  status=1
fi
exit "$status"
