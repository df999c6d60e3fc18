#!/usr/bin/env bash
# Rootless Podman as a plain user (issue 22), as root: the user `reaperd-test` (setup-user.sh)
# runs `podman system service` (Debian 12's Podman 4.3.1, rootless) and reaperd with the XDG
# defaults only: no --config, no DOCKER_HOST, no control.socket or state.dir. It checks that
#   - reaperd reads $XDG_CONFIG_HOME/reaperd/reaperd.yaml, listens on
#     $XDG_RUNTIME_DIR/reaperd/control.sock, keeps its state in $XDG_STATE_HOME/reaperd, and
#     finds the engine at $XDG_RUNTIME_DIR/podman/podman.sock (docker.sock there is absent);
#   - `reaperctl run --own` as that user (its socket found by the same rule) labels what the
#     docker CLI creates, through a proxy socket in XDG_RUNTIME_DIR, and the session's
#     container, network and volume are reaped once the lease ends;
#   - a container without the label, and another session's live container, are untouched;
#   - a runaway log in the user's own storage is capped (logs.max_size);
#   - root is refused at the user's control socket (control.allow_root is false).
# Each run lives in one temp dir (HOME, XDG_RUNTIME_DIR, the binaries): Podman's storage is
# $HOME/.local/share/containers inside it. The service and reaperd are stopped by their pids.
# Usage: run.sh REAPERD REAPERCTL
set -euo pipefail
reaperd_bin=$1
reaperctl_bin=$2
here=$(cd "$(dirname "$0")" && pwd)
user=$("$here/setup-user.sh")

dir=$(mktemp -d "/tmp/reaper-rootless.${REAPER_TEST_RUN:+$REAPER_TEST_RUN.}XXXXXX")
chmod 0755 "$dir"
home=$dir/home runtime=$dir/run
mkdir -m 0700 "$home" "$runtime"
mkdir "$dir/bin"
cp "$reaperd_bin" "$reaperctl_bin" "$dir/bin/"
chmod 0755 "$dir/bin" "$dir/bin/"*
chown "$user:" "$home" "$runtime"

as_user=(setpriv --reuid="$user" --regid="$user" --init-groups
         env -i HOME="$home" XDG_RUNTIME_DIR="$runtime" PATH="$dir/bin:/usr/sbin:/usr/bin:/sbin:/bin")
as_user() { "${as_user[@]}" "$@"; }
# Started as "${as_user[@]}" CMD &: setpriv and env exec what they run, so $! is the
# service's (reaperd's, the holder's) own pid.
podman_pid="" reaperd_pid="" holder_pid=""
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cleanup() {
  [ -n "$holder_pid" ] && kill "$holder_pid" 2>/dev/null && wait_gone "$holder_pid"
  [ -n "$reaperd_pid" ] && kill "$reaperd_pid" 2>/dev/null && wait_gone "$reaperd_pid"
  as_user podman rm -af -t 0 >/dev/null 2>&1 || true
  [ -n "$podman_pid" ] && kill "$podman_pid" 2>/dev/null && wait_gone "$podman_pid"
  # Nothing of this run may outlive it (conmons included): found by the run's dir in their
  # command lines, which nothing else has.
  local left
  left=$(pgrep -a -f "$dir" || true)
  rm -rf "$dir"
  if [ -n "$left" ]; then echo "FAIL: left running: $left"; exit 1; fi
}
wait_gone() { for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; }
trap cleanup EXIT

# Podman as RECIPES section 9 runs it: runc, cgroupfs, the file events logger, no network, vfs.
as_user mkdir -p "$home/.config/containers" "$home/.config/reaperd" "$runtime/podman"
as_user tee "$home/.config/containers/containers.conf" >/dev/null <<'CONF'
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
[containers]
netns = "none"
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
CONF
printf '[storage]\ndriver = "vfs"\n' | as_user tee "$home/.config/containers/storage.conf" >/dev/null
# A short grace and resync, so that the test waits seconds.
printf 'sessions:\n  lease_grace: 1s\nreaper:\n  resync_interval: 2s\nlogs:\n  max_size: 4MiB\n' |
  as_user tee "$home/.config/reaperd/reaperd.yaml" >/dev/null

image=$dir/image
mkdir -p "$image/bin"
cp /bin/busybox "$image/bin/"
for tool in sh sleep echo yes; do ln -s busybox "$image/bin/$tool"; done
tar -C "$image" -c . >"$dir/bb.tar"
chmod 0644 "$dir/bb.tar"
as_user podman import -q "$dir/bb.tar" bb:latest >/dev/null

"${as_user[@]}" podman system service --time=0 "unix://$runtime/podman/podman.sock" \
  >"$dir/podman.log" 2>&1 </dev/null &
podman_pid=$!
for _ in $(seq 1 100); do
  curl -sf --unix-socket "$runtime/podman/podman.sock" http://engine/_ping >/dev/null 2>&1 && break
  sleep 0.1
done
echo "rootless: $(as_user podman --version) as $user (uid $(id -u "$user")), XDG_RUNTIME_DIR $runtime"

"${as_user[@]}" "$dir/bin/reaperd" >"$dir/reaperd.log" 2>&1 </dev/null &
reaperd_pid=$!
ready=0
for _ in $(seq 1 300); do
  grep -q 'ready' "$dir/reaperd.log" && { ready=1; break; }
  kill -0 "$reaperd_pid" 2>/dev/null || break
  sleep 0.1
done
((ready)) || { cat "$dir/reaperd.log"; fail "reaperd did not become ready"; exit 1; }
[ -S "$runtime/reaperd/control.sock" ] && echo "ok: control socket at \$XDG_RUNTIME_DIR/reaperd/control.sock" ||
  fail "no control socket at $runtime/reaperd/control.sock"
[ -f "$home/.local/state/reaperd/state.json" ] && echo "ok: state in \$XDG_STATE_HOME/reaperd" ||
  fail "no state in $home/.local/state/reaperd"

as_user podman run -d --name outsider --network none bb:latest sleep 600 >/dev/null
as_user podman run -d --name other-session --label reaperd.session=live --network none bb:latest sleep 600 >/dev/null
"${as_user[@]}" reaperctl run live -- sleep 600 >/dev/null 2>&1 &
holder_pid=$!
# The docker CLI, through run --own's labelling proxy in XDG_RUNTIME_DIR.
out=$(as_user reaperctl run --own s1 -- sh -c 'echo "proxy $DOCKER_HOST";
  docker run -d --network none bb:latest sleep 600 >/dev/null && docker network create s1net >/dev/null &&
  docker volume create s1vol >/dev/null' 2>&1) || fail "reaperctl run --own: $out"
echo "$out"
grep -q "proxy unix://$runtime/reaperctl-own" <<<"$out" && echo "ok: run --own's socket in XDG_RUNTIME_DIR" ||
  fail "run --own's socket is not in $runtime"

gone=0
for _ in $(seq 1 150); do
  left=$(as_user podman ps -a -q --filter label=reaperd.session=s1; as_user podman network ls -q --filter name=s1net;
         as_user podman volume ls -q --filter name=s1vol)
  [ -z "$left" ] && { gone=1; break; }
  sleep 0.1
done
((gone)) && echo "ok: session s1's container, network and volume reaped" || fail "left after s1 ended: $left"
for name in outsider other-session; do
  [ "$(as_user podman inspect -f '{{.State.Running}}' "$name" 2>&1)" = true ] && echo "ok: $name untouched" ||
    fail "$name was touched"
done

# A runaway log in the user's own storage (k8s-file, ~/.local/share/containers/...), located
# by inspect's LogPath as on a rootful engine, and written by conmon as the user: capped. A
# `yes` fills it at ~230 MB/s (README, Supported engines), so it is checked with room: at most
# twice the cap after 3 s, which uncapped would be ~700 MB.
as_user podman run -d --name runaway --label reaperd.session=live --network none bb:latest yes >/dev/null
log_path=$(as_user podman inspect -f '{{.HostConfig.LogConfig.Path}}' runaway)
[ -z "$log_path" ] && log_path=$(as_user podman inspect -f '{{.LogPath}}' runaway)
sleep 3
size=$(stat -c %s "$log_path")
as_user podman rm -f -t 0 runaway >/dev/null
truncations=$(as_user reaperctl status | sed -n 's/^ *truncate: \([0-9]*\)$/\1/p')
case "$log_path" in "$home/.local/share/containers/"*) ;; *) fail "log not under the user's storage: $log_path" ;; esac
if ((size <= 8 * 1024 * 1024 && ${truncations:-0} > 0)); then
  echo "ok: runaway log capped: $size bytes after 3 s (cap 4 MiB), $truncations truncations"
else
  fail "runaway log not capped: $size bytes, ${truncations:-0} truncations ($log_path)"
fi

refused=$("$dir/bin/reaperctl" --socket "$runtime/reaperd/control.sock" status 2>&1) && fail "root was admitted"
grep -q "serves uid $(id -u "$user") only" <<<"$refused" && echo "ok: root refused: $refused" ||
  fail "root's refusal: $refused"

if ((failures)); then
  echo "--- reaperd's log"; cat "$dir/reaperd.log"
  echo "rootless: $failures failed"; exit 1
fi
echo "rootless: passed"
