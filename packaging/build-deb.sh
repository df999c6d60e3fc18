#!/usr/bin/env bash
# Builds the .debs and checks them with lintian (which must report no errors):
#   reaperd          the daemon and reaperctl
#   libreaper0       libreaper.so.0
#   libreaper-dev    headers, CMake package (find_package(reaper)), pkg-config file (reaper)
#   python3-reaperd  the Python client and its pytest plugin
# Usage: packaging/build-deb.sh [BUILD_DIR]   (default: build-deb beside the sources)
# Prints the path of each .deb, one a line; the last line is reaperd's.
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$source_dir/build-deb}

# Debian's usual hardening flags, so lintian's hardening checks pass.
cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DREAPER_BUILD_TESTS=OFF \
  -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_CXX_FLAGS="-D_FORTIFY_SOURCE=2 -fstack-protector-strong" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-z,relro,-z,now" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-z,relro,-z,now" >/dev/null
cmake --build "$build_dir" -j2 >/dev/null
(cd "$build_dir" && cpack -G DEB >/dev/null)
debs=()
for package in python3-reaperd libreaper-dev libreaper0 reaperd; do
  debs+=("$(ls -t "$build_dir"/"$package"_*.deb | head -n1)")
done

if command -v lintian >/dev/null; then
  # Exit status 1 on an error (warnings are printed but do not fail).
  lintian --fail-on error --suppress-tags "$(cat "$source_dir/packaging/lintian-suppressed")" "${debs[@]}" >&2
fi
printf '%s\n' "${debs[@]}"
