#!/usr/bin/env bash
# consumer_test: libreaper as an installed library. Installs the components libreaper0,
# libreaper-dev and python3-reaperd from BUILD_DIR into a temp prefix (as their .debs would,
# prefix aside), builds the program in project/ outside the tree twice, once with
# find_package(reaper) and once with `pkg-config reaper`, runs both against a private engine
# (tests/harness/engine-guard), and checks that Python finds the reaperd package and its
# pytest plugin in the prefix.
#   run.sh BUILD_DIR VERSION [EXTRA_CXX_FLAGS]   (CTest passes them; the flags are the
#                                                 sanitizer flags of a sanitizer build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
version=$2
extra_flags=${3:-}
guard=$here/../harness/engine-guard

work=$(mktemp -d /tmp/reaper-consumer.XXXXXX)
guard_pid=""
cleanup() {
  if [ -n "$guard_pid" ]; then
    exec {guard_in}>&-  # EOF: the guard stops its engine and removes its dir
    wait "$guard_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "consumer_test: $*" >&2; exit 1; }
step() { echo "== $* ($SECONDS s)"; }

step "install the components into $work/prefix"
prefix=$work/prefix
for component in libreaper0 libreaper-dev python3-reaperd; do
  cmake --install "$build" --prefix "$prefix" --component "$component" >/dev/null
done
libdir=$(dirname "$(find "$prefix" -name 'libreaper.so.0.*' -print -quit)")
if [ -z "$libdir" ] || [ "$libdir" = . ]; then fail "no libreaper.so.0.* installed"; fi
[ -f "$libdir/libreaper.so.$version" ] || fail "no $libdir/libreaper.so.$version"
[ "$(readlink "$libdir/libreaper.so.0")" = "libreaper.so.$version" ] || fail "libreaper.so.0 is not a link to libreaper.so.$version"
[ "$(readlink "$libdir/libreaper.so")" = "libreaper.so.0" ] || fail "libreaper.so is not a link to libreaper.so.0"
# (Each check reads a command's whole output first: `cmd | grep -q` fails under pipefail when
# grep exits before cmd has written everything.)
dynamic=$(readelf -d "$libdir/libreaper.so.$version")
grep -q 'SONAME.*\[libreaper\.so\.0\]' <<<"$dynamic" || fail "SONAME is not libreaper.so.0"
for header in client control engine session template; do
  [ -f "$prefix/include/reaper/$header.hpp" ] || fail "no include/reaper/$header.hpp"
done
[ -z "$(find "$prefix" -name '*.a')" ] || fail "a static library was installed"

launcher=()
if command -v ccache >/dev/null; then launcher=(ccache); fi

step "build with find_package(reaper)"
cmake -S "$here/project" -B "$work/cmake-build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_CXX_COMPILER_LAUNCHER="${launcher[*]}" -DCMAKE_CXX_FLAGS="$extra_flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$extra_flags" >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "configuring the consumer"; }
grep -q "reaper_DIR:PATH=$libdir/cmake/reaper" "$work/cmake-build/CMakeCache.txt" || fail "find_package(reaper) did not use $libdir/cmake/reaper"
cmake --build "$work/cmake-build" >"$work/cmake-build.log" 2>&1 || { cat "$work/cmake-build.log"; fail "building the consumer with CMake"; }

step "build with pkg-config reaper"
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion reaper)" = "$version" ] || fail "pkg-config --modversion reaper is not $version"
# Only what reaper.pc gives (and C++20): no Poco or yaml-cpp flags are needed.
# shellcheck disable=SC2046,SC2086
"${launcher[@]}" g++ -std=c++20 $extra_flags $(pkg-config --cflags reaper) -o "$work/consumer-pc" \
  "$here/project/consumer.cpp" $(pkg-config --libs reaper) \
  -Wl,-rpath,"$(pkg-config --variable=libdir reaper)" || fail "building the consumer with pkg-config"

for binary in "$work/cmake-build/consumer" "$work/consumer-pc"; do
  dynamic=$(readelf -d "$binary")
  grep -q 'NEEDED.*\[libreaper\.so\.0\]' <<<"$dynamic" || fail "$binary does not need libreaper.so.0"
  loads=$(ldd "$binary")
  grep -qF "libreaper.so.0 => $libdir/libreaper.so.0 " <<<"$loads" || fail "$binary does not load $libdir/libreaper.so.0: $loads"
done

step "Python finds reaperd and its pytest plugin in the prefix"
PYTHONPATH=$prefix/lib/python3/dist-packages "${PYTHON3:-python3}" - "$prefix" "$version" <<'PY' || fail "the installed Python package"
import importlib.metadata, sys
import reaperd, reaperd.pytest_plugin
prefix, version = sys.argv[1], sys.argv[2]
assert reaperd.__file__.startswith(prefix), reaperd.__file__
assert reaperd.__version__ == version, (reaperd.__version__, version)
assert importlib.metadata.version("reaperd") == version
plugins = [e.value for e in importlib.metadata.entry_points(group="pytest11") if e.name == "reaperd"]
assert plugins == ["reaperd.pytest_plugin"], plugins
PY

step "run both against a private engine"
coproc GUARD { "$guard"; }
# shellcheck disable=SC2153  # GUARD_PID is set by coproc
guard_pid=$GUARD_PID
guard_in=${GUARD[1]}
read -r answer <&"${GUARD[0]}" || answer=""
case "$answer" in ready\ *) ;; *) fail "engine-guard: $answer" ;; esac
export DOCKER_HOST=unix://${answer#ready }/docker.sock
rootfs=$work/rootfs
mkdir -p "$rootfs/bin" "$rootfs/tmp"
cp /bin/busybox "$rootfs/bin/busybox"
for tool in sh sleep true test; do ln -s busybox "$rootfs/bin/$tool"; done
tar -C "$rootfs" -cf "$work/rootfs.tar" .
"$work/cmake-build/consumer" "$work/rootfs.tar" || fail "the CMake-built consumer failed"
"$work/consumer-pc" "$work/rootfs.tar" || fail "the pkg-config-built consumer failed"
step "passed"
