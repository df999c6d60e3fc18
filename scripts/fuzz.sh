#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cpp) with clang, ASan and UBSan in build-fuzz/,
# and runs each for SECONDS (default 60) from its seed corpus in tests/fuzz-corpus/<name>/.
# Fails on any crash, leak, sanitizer report, broken property or timeout, and leaves the
# input that did it in build-fuzz/findings/<name>/ (replay: build-fuzz/fuzz/<name> FILE).
#
#   scripts/fuzz.sh                 every target for 60 s (what CI runs)
#   scripts/fuzz.sh 600             every target for 10 minutes
#   scripts/fuzz.sh 60 config_fuzz  only the named targets
#
# New inputs that reach new code are kept in build-fuzz/corpus/<name>/ between runs; copy
# the interesting ones into tests/fuzz-corpus/<name>/ to make them seeds.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
build=build-fuzz

scripts/deps.sh build fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DREAPER_FUZZ=ON -DREAPER_SANITIZE=ON -DREAPER_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target fuzzers -j"$(nproc)"

if (($#)); then
  targets=("$@")
else
  targets=()
  for source in fuzz/*_fuzz.cpp; do targets+=("$(basename "$source" .cpp)"); done
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for target in "${targets[@]}"; do
  seeds=tests/fuzz-corpus/${target%_fuzz}
  corpus=$build/corpus/$target
  findings=$build/findings/$target
  mkdir -p "$corpus" "$findings"
  case $target in
    config_fuzz | template_fuzz) dict=fuzz/yaml.dict ;;
    units_fuzz) dict=fuzz/units.dict ;;
    *) dict=fuzz/json.dict ;;
  esac
  echo "fuzz: $target for ${seconds}s (seeds: $seeds)"
  started=$SECONDS
  # -rss_limit_mb: ASan's shadow memory plus the fuzzer's corpus fit well under 2 GiB; more
  # is a leak or a blow-up. -timeout: one input taking over 10 s is a hang.
  if "$build/fuzz/$target" "$corpus" "$seeds" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -max_len=65536 -dict="$dict" -print_final_stats=1 -artifact_prefix="$findings/" \
      >"$build/$target.log" 2>&1; then
    echo "fuzz: $target ok: $(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$build/$target.log" |
      grep -Eo '[0-9]+$') runs in $((SECONDS - started))s, corpus $(ls "$corpus" | wc -l) inputs"
  else
    status=1
    echo "fuzz: $target FAILED; the end of $build/$target.log:" >&2
    tail -n 60 "$build/$target.log" >&2
    echo "fuzz: the input: $(ls -t "$findings" | head -n 1 | sed "s|^|$findings/|")" >&2
  fi
done
exit "$status"
