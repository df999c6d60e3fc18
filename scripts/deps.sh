#!/usr/bin/env bash
# Installs, from Debian only, whatever the build, the tests and the demo need and is missing.
# Idempotent: a second run checks with dpkg and installs nothing.
set -euo pipefail

packages=(
  cmake g++ make pkg-config ccache
  libpoco-dev libyaml-cpp-dev libsystemd-dev libboost-test-dev
  docker.io busybox-static curl tar procps python3-docker docker-compose
  python3-pytest  # the Python client's tests (python/, tests/python/)
  openssl python3  # tls_engine_test: its certificates, and engine-guard's free TLS port
  clang libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes
  systemd debootstrap lintian
  podman runc  # scripts/test-podman.sh: a private Podman engine (README, Supported engines)
  uidmap slirp4netns rootlesskit  # rootless Podman and Docker as a plain user (README, Rootless engines)
  prometheus  # prometheus_test: a real Prometheus scrapes reaperd; promtool lints the exposition
)
# own_clients_test runs testcontainers-node (scripts/fetch-testcontainers.sh): Debian's Node
# and npm, unless a Node with its npm is installed already (NodeSource's nodejs carries npm and
# conflicts with Debian's npm package).
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # docker.io's and prometheus' postinsts may try to start their system services; the tests
  # never use them (each test starts its own engine and its own Prometheus).
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "deps: all present"
fi
