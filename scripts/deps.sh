#!/usr/bin/env bash
# Installs, from Debian only, whatever the build, the tests and the demo need and is missing.
# Idempotent: a second run checks with dpkg and installs nothing.
#
#   scripts/deps.sh [GROUP...]   GROUP: build, test, fuzz, systemd (default: build test)
#
# The groups let a script ask for what it uses only: the README's test command needs build and
# test, and installs test while it builds (scripts/test.sh); clang and the packaging tools are
# for the fuzzing and real-systemd stages, which the main suite does not run.
set -euo pipefail

declare -A groups=(
  [build]="cmake g++ make pkg-config ccache
           libpoco-dev libyaml-cpp-dev libsystemd-dev libboost-test-dev
           python3"  # tests/python and tests/consumer find it at configure time
  # docker.io: each test's private engine; busybox-static: the offline test image;
  # python3-pytest: the Python client's tests (python/, tests/python/); openssl: tls_engine_test's
  # certificates; systemd: systemd-analyze for the unit checks; podman and runc: a private
  # Podman engine (README, Supported engines); uidmap, slirp4netns, rootlesskit: rootless Podman
  # and Docker as a plain user (README, Rootless engines); prometheus: prometheus_test scrapes
  # reaperd with a real Prometheus and lints the exposition with promtool; patchelf: Debian
  # 13's and unstable's Podman run on their own glibc (scripts/fetch-engines.sh podman-trixie,
  # podman-sid).
  [test]="docker.io busybox-static curl tar procps python3-docker docker-compose
          python3-pytest openssl systemd podman runc uidmap slirp4netns rootlesskit prometheus patchelf"
  [fuzz]="clang libclang-rt-14-dev"  # scripts/fuzz.sh: libFuzzer and its sanitizer runtimes
  [systemd]="debootstrap lintian"  # scripts/test-systemd.sh (with test): the .deb and its root fs
)

(($#)) || set -- build test
packages=()
for group in "$@"; do
  [ -n "${groups[$group]+set}" ] || { echo "deps: no group '$group' (build, test, fuzz, systemd)" >&2; exit 64; }
  read -r -a more <<<"$(echo ${groups[$group]})"
  packages+=("${more[@]}")
  # own_clients_test runs testcontainers-node (scripts/fetch-testcontainers.sh): Debian's Node
  # and npm, unless a Node with its npm is installed already (NodeSource's nodejs carries npm
  # and conflicts with Debian's npm package).
  if [ "$group" = test ] && ! { command -v node >/dev/null && command -v npm >/dev/null; }; then
    packages+=(nodejs npm)
  fi
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "deps ($*): installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # docker.io's and prometheus' postinsts may try to start their system services; the tests
  # never use them (each test starts its own engine and its own Prometheus).
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "deps ($*): all present"
fi
