#!/usr/bin/env bash
# Builds and runs every benchmark (bench/*_bench.cpp), each against its own private engine,
# as root on Debian 12. Each prints its figures, the baseline measured in the same run, the
# ratio and PASS/FAIL against its target. daemon_bench took 3.5 minutes here on 2 cores
# (6.5-9 under a load average of 15-25), logcap_bench about 1, proxy_bench (`run --own`'s
# proxy against direct calls) about 2.5, and load_bench, the 5-minute load test, about 6
# (scripts/load.sh runs it alone and takes a duration).
#
#   bench/run.sh                      all benchmarks, in build/ (the tree scripts/test.sh uses)
#   bench/run.sh --build-dir DIR      build elsewhere
#   bench/run.sh daemon_bench         only the named ones
# Exit status: 0 when every target held, 1 when one was missed, 2 when a bench could not run.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
names=()
while (($#)); do
  case "$1" in
    --build-dir) (($# >= 2)) || { echo "usage: $0 [--build-dir DIR] [NAME_bench...]" >&2; exit 64; }; build=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) names+=("$1") ;;
  esac
  shift
done
if ((${#names[@]} == 0)); then
  for source in bench/*_bench.cpp; do names+=("$(basename "$source" .cpp)"); done
fi

scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${names[@]}"

status=0
for name in "${names[@]}"; do
  echo
  echo "==> $name"
  rc=0
  "$build/bench/$name" || rc=$?
  echo "==> $name: $( ((rc == 0)) && echo "every target held" || echo "exit $rc")"
  if ((rc > status)); then status=$rc; fi
done
exit "$status"
