#!/usr/bin/env bash
# Fetches the Docker engines users run today from Debian's newer suites, each with its own CLI
# and Compose v2, into a cache dir, for the test harness (REAPER_TEST_ENGINE=docker-trixie or
# docker-sid) and scripts/test-engine.sh:
#   trixie  Debian 13's docker.io, docker-cli and docker-compose (Docker 26.1, Compose 2.26):
#           required; this script fails if it cannot fetch it or it does not run here.
#   sid     Debian unstable's (Docker 28.5 and Compose 2.40 when this was written). Unstable
#           moves: if it no longer fetches or runs on this machine, that is said in one line
#           and written to <cache>/sid/unavailable, and the script still succeeds; the harness
#           and scripts/test-engine.sh docker-sid then say so instead of running.
#   podman-trixie
#           Debian 13's podman (5.4) with its netavark and aardvark-dns, for
#           scripts/test-podman.sh --engine trixie: required. Built against glibc 2.38+, these
#           run here on Debian 13's own glibc, fetched beside them: patchelf points each at that
#           loader and library dir (libc6 and the libraries podman links that Debian 12 has
#           too old or not at all). <cache>/podman-trixie/bin/podman runs it, with conmon and
#           runc from Debian 12 (scripts/deps.sh) and its network helpers from the same dir.
#   podman-sid
#           Debian unstable's podman (5.8 when this was written, serving API 1.44), set up the
#           same way on unstable's glibc, for scripts/test-podman.sh --engine sid. Unstable
#           moves: like sid, optional.
#
# The host's apt sources are never changed: each suite has an apt state of its own (its own
# sources file, lists and archive cache under <cache>/<suite>), and `apt-get download` only
# fetches the .debs, which are unpacked with `dpkg-deb -x` into <cache>/<suite>/root. The
# engines run with Debian 12's containerd and runc (scripts/deps.sh installs docker.io, which
# brings both).
#
# Idempotent: a suite whose unpacked engine, CLI and Compose run is left as it is (no
# download) unless --refresh is given. Prints one line per suite naming what it holds, and
# writes it to <cache>/<suite>/versions.
#
#   scripts/fetch-engines.sh [--refresh] [SUITE...]     (default: trixie sid)
# Environment: REAPERD_TEST_CACHE (default /var/cache/reaperd-test); the engines live in
# $REAPERD_TEST_CACHE/engines/<suite>.
set -euo pipefail

cache=${REAPERD_TEST_CACHE:-/var/cache/reaperd-test}/engines
refresh=false
suites=()
while (($#)); do
  case "$1" in
    --refresh) refresh=true ;;
    trixie | sid | podman-trixie | podman-sid) suites+=("$1") ;;
    *) echo "usage: $0 [--refresh] [trixie|sid|podman-trixie|podman-sid...]" >&2; exit 64 ;;
  esac
  shift
done
((${#suites[@]})) || suites=(trixie sid)

# packages SUITE: the .debs it takes.
packages() {
  case "$1" in
    podman-trixie)
      echo podman netavark aardvark-dns libc6 libgpgme11t64 libassuan9 libgpg-error0 libseccomp2 \
        libsqlite3-0 libsubid5 libaudit1 libcap-ng0 libselinux1 libpcre2-8-0 libsemanage2 libbsd0 libmd0 \
        libsystemd0 libcap2 libzstd1 liblzma5 liblz4-1 libgcrypt20 ;;
    # What podman links in unstable (its libgpgme and libsubid are newer sonames), found with
    # the suite's loader: ld-linux-x86-64.so.2 --library-path <lib dir> --list podman.
    podman-sid)
      echo podman netavark aardvark-dns libc6 libgcc-s1 libgpgme45 libassuan9 libgpg-error0 libseccomp2 \
        libsqlite3-0 libsubid6 libacl1 libaudit1 libbsd0 libcrypt1 libpam0g libselinux1 libsemanage2 \
        libsepol2 libsystemd0 libcap-ng0 libpcre2-8-0 libbz2-1.0 libmd0 ;;
    *) echo docker.io docker-cli docker-compose ;;
  esac
}

# check SUITE: prints what it holds ("<engine> / <cli> / <compose>" for a Docker) if it runs,
# else fails saying what does not.
check() {
  if [[ $1 == podman-* ]]; then
    local podman
    podman=$("$cache/$1/bin/podman" --version 2>&1) || { echo "podman does not run: $podman"; return 1; }
    echo "$podman"
    return
  fi
  local root=$cache/$1/root engine cli compose
  engine=$("$root/usr/sbin/dockerd" --version 2>&1) || { echo "dockerd does not run: $engine"; return 1; }
  cli=$("$root/usr/bin/docker" --version 2>&1) || { echo "docker does not run: $cli"; return 1; }
  compose=$("$root/usr/libexec/docker/cli-plugins/docker-compose" version 2>&1) ||
    { echo "docker-compose does not run: $compose"; return 1; }
  [ -x "$root/usr/bin/docker-compose" ] || { echo "no standalone docker-compose"; return 1; }
  echo "dockerd: $engine; cli: $cli; compose: $compose"
}

# fetch SUITE: a private apt state, the suite's .debs, unpacked afresh.
fetch() {
  local suite=$1 dir=$cache/$1
  mkdir -p "$dir/src" "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/debs"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "${suite#podman-}" >"$dir/src/debian.sources"
  local apt=(apt-get -q -o "Dir::Etc::sourcelist=/dev/null" -o "Dir::Etc::sourceparts=$dir/src"
             -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache")
  "${apt[@]}" update >"$dir/fetch.log" 2>&1 || return 1
  rm -f "$dir"/debs/*.deb
  # As root, apt warns that its _apt user cannot write here; the download is done anyway.
  local debs
  read -r -a debs <<<"$(packages "$suite")"
  (cd "$dir/debs" && "${apt[@]}" download "${debs[@]}") >>"$dir/fetch.log" 2>&1 || return 1
  rm -rf "$dir/root.new"
  local deb
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root.new" || return 1; done
  rm -rf "$dir/root"
  mv "$dir/root.new" "$dir/root"
  (cd "$dir/debs" && ls -1 ./*.deb | sed 's|^\./||') >"$dir/debs.list"
  [[ $suite != podman-* ]] || link_podman "$dir" >>"$dir/fetch.log" 2>&1
}

# link_podman DIR: DIR/libexec holds podman and its network helpers, each patched to load with
# the suite's own glibc (DT_RPATH, which the libraries they load inherit, unlike DT_RUNPATH),
# and DIR/bin/podman runs it. CONTAINERS_HELPER_BINARY_DIR points Podman at those helpers;
# the cgroups v1 warning (this host's hybrid cgroups) would be in every test's output.
link_podman() {
  local dir=$1 lib=$1/root/usr/lib/x86_64-linux-gnu tool
  rm -rf "$dir/libexec" "$dir/bin"
  mkdir -p "$dir/libexec" "$dir/bin"
  for tool in usr/bin/podman usr/lib/podman/netavark usr/lib/podman/aardvark-dns; do
    cp "$dir/root/$tool" "$dir/libexec/" || return 1
    patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib" \
      "$dir/libexec/$(basename "$tool")" || return 1
  done
  printf '#!/bin/sh\nexport PODMAN_IGNORE_CGROUPSV1_WARNING=1 CONTAINERS_HELPER_BINARY_DIR=%s\nexec %s "$@"\n' \
    "$dir/libexec" "$dir/libexec/podman" >"$dir/bin/podman"
  chmod +x "$dir/bin/podman"
}

status=0
for suite in "${suites[@]}"; do
  dir=$cache/$suite
  rm -f "$dir/unavailable"
  why=""
  if $refresh || ! check "$suite" >/dev/null 2>&1; then
    fetch "$suite" ||
      why="could not fetch or set up $(packages "$suite") from $suite: $(tail -n 3 "$dir/fetch.log" 2>/dev/null | tr '\n' ' ')"
  fi
  if [ -z "$why" ]; then
    if found=$(check "$suite"); then
      echo "$found (debs: $(tr '\n' ' ' <"$dir/debs.list"))" >"$dir/versions"
      echo "fetch-engines: $suite: $(cat "$dir/versions")"
      continue
    fi
    why="$suite's engine does not run on this machine: $found"
  fi
  if [[ $suite == *sid ]]; then
    mkdir -p "$dir"
    echo "$why" >"$dir/unavailable"
    echo "fetch-engines: $suite: UNAVAILABLE, its stage is skipped: $why"
  else
    echo "fetch-engines: $suite: FAILED: $why" >&2
    status=1
  fi
done
exit "$status"
