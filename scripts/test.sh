#!/usr/bin/env bash
# Runs every test, on a fresh Debian 12 machine as root: installs what is missing, builds,
# and runs the whole CTest suite. Each integration test process starts its own private
# dockerd (tests/harness/engine-guard) and stops it by pid, also when a test fails or dies.
#
#   scripts/test.sh              the normal build (build/)
#   scripts/test.sh --sanitize   the ASan+UBSan build (build-asan/)
#   scripts/test.sh --tsan       the ThreadSanitizer build (build-tsan/), threaded tests only
#   extra arguments after -- go to ctest, e.g. scripts/test.sh -- -R session
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
cmake_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
ctest_flags=()
while (($#)); do
  case "$1" in
    --sanitize) build=build-asan; cmake_flags+=(-DREAPER_SANITIZE=ON) ;;
    --tsan) build=build-tsan; cmake_flags+=(-DREAPER_TSAN=ON) ;;
    --) shift; ctest_flags+=("$@"); break ;;
    *) echo "usage: $0 [--sanitize|--tsan] [-- CTEST_ARGS...]" >&2; exit 64 ;;
  esac
  shift
done

began=$SECONDS
scripts/deps.sh build
# What only the tests need (engines, Podman, Prometheus, Node, and testcontainers-node for
# own_clients_test: minutes of downloads on a fresh machine) installs while the build runs; its
# output is printed once both are done.
deps_log=$(mktemp /tmp/reaper-deps.XXXXXX)
{ scripts/deps.sh test && scripts/fetch-testcontainers.sh; } >"$deps_log" 2>&1 &
deps_pid=$!
build_began=$SECONDS
# Let ccache reuse objects across checkouts in different directories (CI clones afresh).
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
build_status=0
{ cmake -S . -B "$build" "${cmake_flags[@]}" >/dev/null && cmake --build "$build" -j"$(nproc)"; } ||
  build_status=$?
build_s=$((SECONDS - build_began))
deps_status=0
wait "$deps_pid" || deps_status=$?
cat "$deps_log"
rm -f "$deps_log"
((deps_status == 0)) || { echo "test.sh: installing what the tests need failed (above)" >&2; exit "$deps_status"; }
((build_status == 0)) || { echo "test.sh: the build failed (above)" >&2; exit "$build_status"; }
prepared_s=$((SECONDS - began))
# The engine every integration test of this run starts privately (the host's, Debian 12's).
echo "test: engine: $(dockerd --version), $(containerd --version | cut -d' ' -f1-3), $(runc --version | head -n 1)"

# LeakSanitizer reports leaks at exit; detect_leaks is on by default with ASan on Linux.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Engines of this run are named after it (tests/harness/engine-guard), so the check below
# never mistakes another run's engine for one of ours.
export REAPER_TEST_RUN=run$$
status=0
tests_began=$SECONDS
ctest --test-dir "$build" --output-on-failure -j2 "${ctest_flags[@]}" || status=$?
echo "test.sh: ${prepared_s} s to install and build (the build alone ${build_s} s), $((SECONDS - tests_began)) s of tests"

# A test that leaves an engine behind is a bug in the test: say so and fail.
left=$(pgrep -af -- "--data-root /tmp/reaper-engine\.$REAPER_TEST_RUN\." || true)
if [ -n "$left" ]; then
  echo "test.sh: engines left running by the tests:" >&2
  echo "$left" >&2
  status=1
fi
exit "$status"
