#!/usr/bin/env bash
# Builds the reaperd .deb and checks it with lintian (which must report no errors).
# Usage: packaging/build-deb.sh [BUILD_DIR]   (default: build-deb beside the sources)
# Prints the path of the .deb as its last line.
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$source_dir/build-deb}

# Debian's usual hardening flags, so lintian's hardening checks pass.
cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DREAPER_BUILD_TESTS=OFF \
  -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_CXX_FLAGS="-D_FORTIFY_SOURCE=2 -fstack-protector-strong" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-z,relro,-z,now" >/dev/null
cmake --build "$build_dir" -j2 >/dev/null
(cd "$build_dir" && cpack -G DEB >/dev/null)
deb=$(ls -t "$build_dir"/reaperd_*.deb | head -n1)

if command -v lintian >/dev/null; then
  # Exit status 1 on an error (warnings are printed but do not fail).
  lintian --fail-on error --suppress-tags "$(cat "$source_dir/packaging/lintian-suppressed")" "$deb" >&2
fi
echo "$deb"
