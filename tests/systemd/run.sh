#!/usr/bin/env bash
# reaperd under a real systemd (issue 6, item 7).
#
# A container of a private engine runs systemd as PID 1 (Debian bookworm, minbase, made with
# debootstrap and cached), the reaperd .deb is installed inside, and the unit runs against
# the same private engine, whose socket is bound in. Checks, in order:
#   1. the package enabled the unit, and systemd started it at boot;
#   2. `systemctl start` stays "activating" while the engine does not answer and becomes
#      active only once reaperd reported READY=1;
#   3. a reap shows in `journalctl -u reaperd` with its MESSAGE_ID and fields, and
#      `journalctl -x` explains it from the installed catalog;
#   4. SIGSTOP to reaperd: the watchdog (WatchdogSec=4s in a test drop-in) kills it and
#      systemd restarts it;
#   5. `systemctl reload` with a broken config leaves it active, same pid, old config, with
#      the error in the journal;
#   6. the package installed again (the upgrade path restarts reaperd) keeps a live
#      session's container, leased by `reaperctl hold`, which is reaped once the holder ends;
#   7. `systemctl stop` exits cleanly (status 0, result success);
#   8. the user unit, under the manager of a lingering plain user: READY, a reap, its records
#      in `journalctl --user -u reaperd`, the watchdog, the package installed again keeping
#      the user's live session's container, a clean stop (issue 22).
#
# Usage: tests/systemd/run.sh REAPERD_DEB
# Environment: REAPERD_TEST_CACHE (default /var/cache/reaperd-test) keeps the debootstrapped
# root file system between runs (the first run takes minutes to make it; later runs reuse it).
# Needs root, debootstrap, docker.io (dockerd only: the engine is private), busybox-static.
set -uo pipefail

deb=$(readlink -f "${1:?usage: run.sh REAPERD_DEB}")
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
cache=${REAPERD_TEST_CACHE:-/var/cache/reaperd-test}
base_rootfs=$cache/rootfs-base

failures=0
passes=0
started=$(date +%s)
step() { echo "--- $*"; }
pass() { echo "ok: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

work=$(mktemp -d /tmp/reaperd-systemd-test.XXXXXX)
guard_pid=""
container=""
cleanup() {
  if [ -n "$container" ]; then
    docker_cli rm -f "$container" >/dev/null 2>&1
  fi
  if [ -n "$guard_pid" ]; then
    # Closing its stdin makes engine-guard stop the engine (by pid) and remove its dir.
    eval "exec ${guard[1]}>&-"
    wait "$guard_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# --- The root file system: bookworm minbase with systemd, cached.
# The mirror is the one this machine's apt uses.
debian_mirror() {
  local m
  m=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  [ -n "$m" ] || m=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
  echo "$m"
}
if [ ! -d "$base_rootfs" ]; then
  step "making the cached root file system in $base_rootfs (debootstrap; minutes, once)"
  mkdir -p "$cache"
  rm -rf "$base_rootfs.tmp"
  if ! debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm \
      "$base_rootfs.tmp" "$(debian_mirror)" >"$cache/debootstrap.log" 2>&1; then
    tail -n 20 "$cache/debootstrap.log"
    echo "FAIL: debootstrap"
    exit 1
  fi
  mv "$base_rootfs.tmp" "$base_rootfs"
fi

# The package's run-time dependencies (and libpam-systemd, for step 8) go into the cached root
# file system once (from the mirror); the package itself goes into a per-run copy.
missing=()
while read -r dep; do
  [ -n "$dep" ] || continue
  chroot "$base_rootfs" dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'install ok installed' \
    || missing+=("$dep")
done < <(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//; s/ //g'
         # and for the user unit's step: pam_systemd gives a lingering user's manager its
         # XDG_RUNTIME_DIR.
         echo libpam-systemd)
if ((${#missing[@]})); then
  step "installing ${missing[*]} into the cached root file system"
  cp /etc/resolv.conf "$base_rootfs/etc/resolv.conf"
  if ! { chroot "$base_rootfs" apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive chroot "$base_rootfs" \
           apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$work/apt.log" 2>&1; then
    tail -n 20 "$work/apt.log"
    echo "FAIL: installing the package's dependencies"
    exit 1
  fi
  chroot "$base_rootfs" apt-get clean
fi

step "installing $(basename "$deb") into a copy of the root file system"
rootfs=$work/rootfs
cp -a "$base_rootfs" "$rootfs"
cp "$deb" "$rootfs/tmp/reaperd.deb"
if ! chroot "$rootfs" dpkg -i /tmp/reaperd.deb >"$work/dpkg.log" 2>&1; then
  cat "$work/dpkg.log"
  echo "FAIL: dpkg -i"
  exit 1
fi
rm "$rootfs/tmp/reaperd.deb"
if [ -L "$rootfs/etc/systemd/system/multi-user.target.wants/reaperd.service" ]; then
  pass "installing the package enabled reaperd.service"
else
  fail "reaperd.service is not enabled after dpkg -i"
fi

# Test drop-in: a short watchdog so the stall test is quick, a quick restart.
mkdir -p "$rootfs/etc/systemd/system/reaperd.service.d"
cat >"$rootfs/etc/systemd/system/reaperd.service.d/test.conf" <<'EOF'
[Service]
WatchdogSec=4s
RestartSec=1s
EOF
# systemd in a container needs its cgroup mounts writable.
cat >"$rootfs/sbin/test-init" <<'EOF'
#!/bin/sh
awk '$9 == "cgroup" || $9 == "cgroup2" { print $5 }' /proc/self/mountinfo | while read -r m; do
  mount -o remount,bind,rw "$m"
done
exec /lib/systemd/systemd
EOF
chmod 755 "$rootfs/sbin/test-init"
# Nothing in this system needs a login prompt or a network.
chroot "$rootfs" systemctl mask getty@tty1.service console-getty.service systemd-networkd.service \
  systemd-resolved.service >/dev/null 2>&1

# --- A private engine, run by the test harness's guard.
step "starting a private engine"
coproc guard { exec "$source_dir/tests/harness/engine-guard" 2>&1; }
guard_pid=$guard_PID
read -r -t 120 answer dir <&"${guard[0]}" || answer=""
if [ "$answer" != ready ]; then
  echo "FAIL: the private engine did not start ($answer $dir)"
  exit 1
fi
engine_sock=$dir/docker.sock
docker_cli() { docker -H "unix://$engine_sock" "$@"; }

step "importing the image"
image=reaperd-systemd-test:latest
if ! tar -C "$rootfs" -c . | docker_cli import -c 'CMD ["/sbin/test-init"]' -c 'ENV container=docker' \
    - "$image" >/dev/null; then
  echo "FAIL: docker import"
  exit 1
fi
rm -rf "$rootfs"
# A tiny image for the session containers reaperd is to reap.
mkdir -p "$work/busybox/bin"
cp /bin/busybox "$work/busybox/bin/busybox"
for tool in sh sleep; do ln -s busybox "$work/busybox/bin/$tool"; done
tar -C "$work/busybox" -c . | docker_cli import - reaperd-systemd-test/busybox:latest >/dev/null

step "booting systemd in a container"
container=$(docker_cli run -d --network none --cgroupns private --cap-add ALL --cap-drop SYS_RESOURCE \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  --security-opt systempaths=unconfined --stop-signal SIGRTMIN+3 \
  --tmpfs /run --tmpfs /run/lock --tmpfs /tmp \
  -v "$engine_sock:/run/docker.sock" -t "$image")
if [ -z "$container" ]; then
  echo "FAIL: docker run"
  exit 1
fi
in_ctr() { docker_cli exec "$container" "$@"; }
# The unit's journal as one string: `journalctl | grep -q` under pipefail fails when grep
# stops reading at the first match and journalctl gets SIGPIPE (CI saw a false "no
# 'stopped' record" that way, with two of them in the journal).
unit_journal() { in_ctr journalctl -u reaperd.service --no-pager "$@" 2>/dev/null; }
unit_prop() { in_ctr systemctl show -p "$1" --value reaperd.service 2>/dev/null | tr -d '\r'; }
journal_json() { in_ctr journalctl -u reaperd.service --no-pager -o json "$@" 2>/dev/null; }
# wait_for SECONDS COMMAND...: polls every 0.2 s.
wait_for() {
  local deadline=$(($(date +%s) + $1))
  shift
  until "$@"; do
    (($(date +%s) < deadline)) || return 1
    sleep 0.2
  done
}
is_active() { [ "$(unit_prop ActiveState)" = active ]; }
# leased SESSION RUNNER...: whether `reaperctl status --json`, run through RUNNER (in_ctr, or
# as_user for the user's reaperd), shows SESSION leased.
leased() {
  local session=$1
  shift
  "$@" reaperctl status --json 2>/dev/null | grep -o "{[^{}]*\"id\":\"$session\"[^{}]*}" |
    grep -q '"state":"leased"'
}
container_gone() { ! docker_cli inspect "$1" >/dev/null 2>&1; }
# hold_with_container SESSION PIDFILE RUNNER...: `reaperctl hold SESSION` through RUNNER (its
# pid in PIDFILE, in the container) and a running container of that session, whose id goes to
# $held_container; waits until the session is leased.
hold_with_container() {
  local session=$1 pidfile=$2
  shift 2
  "$@" sh -c "reaperctl hold $session </dev/null >$pidfile.log 2>&1 & echo \$! >$pidfile"
  held_container=$(docker_cli create --network none --label "reaperd.session=$session" --name "$session" \
    reaperd-systemd-test/busybox:latest sleep 600)
  docker_cli start "$held_container" >/dev/null
  wait_for 30 leased "$session" "$@" || fail "session $session is not leased"
}
# end_hold_then_reaped PIDFILE CONTAINER WHAT: ends the `reaperctl hold` whose pid is in PIDFILE
# (in the container); CONTAINER, WHAT, is to be reaped as usual.
end_hold_then_reaped() {
  in_ctr sh -c "kill \"\$(cat $1)\""
  if wait_for 60 container_gone "$2"; then
    pass "once its holder ended, $3 was reaped as usual"
  else
    fail "$3 was not reaped after its holder ended"
    docker_cli rm -f "$2" >/dev/null 2>&1
  fi
}

booted() {
  local s
  s=$(in_ctr systemctl is-system-running 2>/dev/null | tr -d '\r')
  [ "$s" = running ] || [ "$s" = degraded ]
}
if wait_for 120 booted; then
  pass "systemd is up ($(in_ctr systemctl is-system-running 2>/dev/null | tr -d '\r'))"
else
  docker_cli logs "$container" | tail -n 30
  fail "systemd did not finish booting"
fi

# 1. Started at boot by the package's enablement.
if wait_for 60 is_active; then
  pass "reaperd.service active after boot (pid $(unit_prop MainPID))"
else
  in_ctr systemctl status --no-pager reaperd.service
  fail "reaperd.service not active after boot"
fi
# The unit's Nice= (the log capper's head start over CPU-bound neighbours) reached the process.
# /proc/PID/stat's 19th field (the minbase system has no ps; reaperd's name has no space).
nice_now=$(in_ctr cut -d' ' -f19 "/proc/$(unit_prop MainPID)/stat" | tr -d '\r')
[ "$nice_now" = -5 ] && pass "reaperd runs at nice -5 (Nice=)" || fail "reaperd's nice is '$nice_now', not -5"

# 2. Active only after READY: with the engine unreachable, start stays "activating".
step "start with the engine unreachable, then reachable"
in_ctr systemctl stop reaperd.service
mkdir_dropin='mkdir -p /run/systemd/system/reaperd.service.d && printf "[Service]\nEnvironment=DOCKER_HOST=unix:///run/engine-later.sock\n" >/run/systemd/system/reaperd.service.d/engine.conf'
in_ctr sh -c "$mkdir_dropin"
in_ctr systemctl daemon-reload
in_ctr systemctl start --no-block reaperd.service
sleep 5
state=$(unit_prop ActiveState)
if [ "$state" = activating ]; then
  pass "no engine for 5 s: the unit is still activating (READY not sent)"
else
  fail "with the engine unreachable the unit is '$state', not activating"
fi
in_ctr ln -s /run/docker.sock /run/engine-later.sock
t0=$(date +%s%N)
if wait_for 60 is_active; then
  pass "the engine appeared: active $((($(date +%s%N) - t0) / 1000000)) ms later"
else
  fail "the unit did not become active once the engine answered"
fi
ready_line=$(journal_json MESSAGE=ready | tail -n 1)
if [ -n "$ready_line" ]; then
  pass "reaperd logged 'ready'"
else
  fail "no 'ready' record in the journal"
fi
in_ctr systemctl stop reaperd.service
in_ctr rm -f /run/systemd/system/reaperd.service.d/engine.conf /run/engine-later.sock
in_ctr systemctl daemon-reload
# A blocking start returns only once READY=1 arrived.
if in_ctr systemctl start reaperd.service && is_active; then
  pass "systemctl start returned with the unit active"
else
  fail "systemctl start"
fi

# 3. A reap in the journal, with its MESSAGE_ID and fields.
step "a session's container reaped"
session=systemd-test-$$
victim=$(docker_cli create --network none --label "reaperd.session=$session" --name "victim-$$" \
  reaperd-systemd-test/busybox:latest sleep 600)
docker_cli start "$victim" >/dev/null
bystander=$(docker_cli create --network none --name "bystander-$$" reaperd-systemd-test/busybox:latest sleep 600)
docker_cli start "$bystander" >/dev/null
# The daemon must have seen the container before the session is ended.
sleep 2
if ! in_ctr reaperctl end "$session"; then
  fail "reaperctl end $session"
fi
gone() { ! docker_cli inspect "$victim" >/dev/null 2>&1; }
if wait_for 60 gone; then
  pass "the session's container was removed"
else
  fail "the session's container is still there"
fi
if docker_cli inspect "$bystander" >/dev/null 2>&1 && docker_cli inspect "$container" >/dev/null 2>&1; then
  pass "the unlabelled containers (the bystander, the systemd container itself) are untouched"
else
  fail "an unlabelled container was removed"
fi
reaped_id=0e62ab2724b54aa1a1c7ea5d3e0bebbf
record=""
has_reap_record() {
  record=$(journal_json "MESSAGE_ID=$reaped_id" "CONTAINER_ID=$victim" | tail -n 1)
  [ -n "$record" ]
}
if wait_for 30 has_reap_record; then
  echo "$record"
  ok=1
  for field in "\"MESSAGE_ID\":\"$reaped_id\"" "\"CONTAINER_ID\":\"$victim\"" \
               "\"CONTAINER_NAME\":\"/?victim-$$\"" "\"SESSION_ID\":\"$session\"" "\"ACTION\":\"" \
               "\"PRIORITY\":\"5\"" "\"SYSLOG_IDENTIFIER\":\"reaperd\"" "\"_TRANSPORT\":\"journal\""; do
    if ! grep -qE -- "$field" <<<"$record"; then
      fail "the reap record lacks $field"
      ok=0
    fi
  done
  ((ok)) && pass "journalctl -u reaperd MESSAGE_ID=$reaped_id shows the reap with its fields"
else
  journal_json | tail -n 20
  fail "no container-reaped record for $victim in journalctl -u reaperd"
fi
explained=$(in_ctr journalctl -x -u reaperd.service --no-pager "MESSAGE_ID=$reaped_id" 2>/dev/null | grep -m1 'Subject:')
if [ -n "$explained" ]; then
  pass "journalctl -x explains the reap from the installed catalog:$explained"
else
  fail "journalctl -x shows no catalog text for $reaped_id (is /usr/lib/systemd/catalog/reaperd.catalog installed and compiled?)"
fi
docker_cli rm -f "$bystander" >/dev/null

# 4. A stalled main loop: the watchdog kills it, Restart=on-failure brings it back.
step "SIGSTOP: the watchdog restarts reaperd"
old_pid=$(unit_prop MainPID)
old_restarts=$(unit_prop NRestarts)
in_ctr systemctl kill --kill-whom=main --signal=SIGSTOP reaperd.service
t0=$(date +%s%N)
restarted() {
  local pid
  pid=$(unit_prop MainPID)
  [ "$pid" != 0 ] && [ "$pid" != "$old_pid" ] && is_active
}
if wait_for 90 restarted; then
  pass "restarted $((($(date +%s%N) - t0) / 1000000)) ms after SIGSTOP (pid $old_pid -> $(unit_prop MainPID), NRestarts $old_restarts -> $(unit_prop NRestarts))"
else
  fail "not restarted after SIGSTOP (state $(unit_prop ActiveState), pid $(unit_prop MainPID))"
fi
if grep -q "Watchdog timeout" <<<"$(unit_journal)"; then
  pass "the journal says: $(in_ctr journalctl -u reaperd.service --no-pager | grep -m1 -o 'Watchdog timeout.*')"
else
  fail "no 'Watchdog timeout' in the journal"
fi

# 5. Reload with a broken config: still active, same pid, error in the journal.
step "reload with a broken config"
pid=$(unit_prop MainPID)
in_ctr cp /etc/reaperd/reaperd.yaml /tmp/reaperd.yaml.good
in_ctr sh -c 'printf "sessions:\n  lease_grace: soon\nbogus_key: 1\n" >/etc/reaperd/reaperd.yaml'
since=$(in_ctr date '+%Y-%m-%d %H:%M:%S' | tr -d '\r')
sleep 1
if in_ctr systemctl reload reaperd.service; then
  pass "systemctl reload returned 0"
else
  fail "systemctl reload failed"
fi
# The record is at priority err, and its fields (or message) name the bad key.
config_record=""
config_error() {
  config_record=$(journal_json --since "$since" -p err | grep -F "not reloaded" | tail -n 1)
  grep -q "lease_grace" <<<"$config_record"
}
if wait_for 30 config_error; then
  pass "the error is in the journal: $(grep -o '"MESSAGE":"[^"]*"' <<<"$config_record") $(grep -o '"ERROR":"[^"]*"' <<<"$config_record")"
else
  in_ctr journalctl -u reaperd.service --no-pager --since "$since" -o json
  fail "no config error (priority err, naming lease_grace) in the journal after the reload"
fi
sleep 2
if is_active && [ "$(unit_prop MainPID)" = "$pid" ]; then
  pass "still active on the old config, same pid $pid"
else
  fail "after the broken reload: state $(unit_prop ActiveState), pid $(unit_prop MainPID) (was $pid)"
fi
if in_ctr reaperctl status >/dev/null 2>&1; then
  pass "the control socket still answers"
else
  fail "reaperctl status fails after the broken reload"
fi
in_ctr cp /tmp/reaperd.yaml.good /etc/reaperd/reaperd.yaml
since=$(in_ctr date '+%Y-%m-%d %H:%M:%S' | tr -d '\r')
sleep 1
in_ctr systemctl reload reaperd.service
reloaded() { grep -qF '"MESSAGE":"configuration reloaded"' <<<"$(journal_json --since "$since")"; }
if wait_for 30 reloaded && is_active; then
  pass "the fixed config reloads"
else
  fail "no 'configuration reloaded' after restoring the config"
fi

# 6. An upgrade (the .deb installed again: postinst restarts reaperd) costs a live session
# nothing: its lease comes back within lease_grace and its container stays (issue 10).
step "reinstalling the package keeps a live session's container"
live_session=systemd-live-$$
hold_with_container "$live_session" /tmp/hold.pid in_ctr
live=$held_container
pid_before=$(unit_prop MainPID)
# /tmp is a tmpfs in the container, which docker cp does not write into.
docker_cli cp "$deb" "$container:/var/tmp/reaperd.deb"
if in_ctr dpkg -i /var/tmp/reaperd.deb >"$work/upgrade.log" 2>&1; then
  pass "dpkg -i of the package over itself (upgrade path)"
else
  cat "$work/upgrade.log"
  fail "dpkg -i (upgrade)"
fi
restarted_by_upgrade() { [ "$(unit_prop MainPID)" != "$pid_before" ] && is_active; }
wait_for 60 restarted_by_upgrade || fail "the upgrade did not restart reaperd (pid $pid_before -> $(unit_prop MainPID))"
# Past the shipped lease_grace (10s) with margin.
sleep 14
if docker_cli inspect "$live" >/dev/null 2>&1 && leased "$live_session" in_ctr; then
  pass "after the upgrade's restart and lease_grace, the live session is leased and its container is there"
else
  in_ctr reaperctl status 2>&1 | head -20
  fail "the live session's container was removed or its lease did not come back"
fi
end_hold_then_reaped /tmp/hold.pid "$live" "the session's container"

# 7. A clean stop.
step "systemctl stop"
if in_ctr systemctl stop reaperd.service; then
  result=$(unit_prop Result)
  status=$(unit_prop ExecMainStatus)
  code=$(unit_prop ExecMainCode)
  # ExecMainCode 1 = exited (not killed).
  if [ "$result" = success ] && [ "$status" = 0 ] && [ "$code" = 1 ]; then
    pass "stopped cleanly (Result=$result, ExecMainStatus=$status)"
  else
    fail "stop: Result=$result ExecMainCode=$code ExecMainStatus=$status"
  fi
else
  fail "systemctl stop failed"
fi
# journald may still be storing the last lines when systemctl stop returns.
logged_stopped() { grep -q "^stopped" <<<"$(unit_journal -o cat)"; }
if wait_for 10 logged_stopped; then
  pass "reaperd logged 'stopped'"
else
  fail "no 'stopped' record"
fi

# 8. The user unit (issue 22) under the user manager of a lingering plain user, the system
# reaperd stopped (step 7): `systemctl --user enable --now reaperd` starts it with READY and
# the watchdog, a session is reaped, `journalctl --user -u reaperd` shows the record with its
# fields, and a stall is restarted by the watchdog. Its engine is the private one, reached
# through DOCKER_HOST in a user drop-in (the socket handed to the user: rootless engines are
# tested in tests/rootless/).
step "the user unit under a lingering user's manager"
user=reaperd-test
in_ctr useradd --create-home --shell /bin/sh "$user" >/dev/null 2>&1
uid=$(in_ctr id -u "$user" | tr -d '\r')
in_ctr chown "$user" /run/docker.sock
in_ctr sh -c "mkdir -p /home/$user/.config/systemd/user/reaperd.service.d /home/$user/.config/reaperd &&
  printf '[Service]\nEnvironment=DOCKER_HOST=unix:///run/docker.sock\nWatchdogSec=4s\nRestartSec=1s\n' \
    >/home/$user/.config/systemd/user/reaperd.service.d/test.conf &&
  printf 'sessions:\n  lease_grace: 1s\n' >/home/$user/.config/reaperd/reaperd.yaml &&
  chown -R $user: /home/$user/.config"
in_ctr loginctl enable-linger "$user"
as_user() { in_ctr runuser -u "$user" -- env XDG_RUNTIME_DIR="/run/user/$uid" "$@"; }
user_manager_up() { [ "$(in_ctr systemctl is-active "user@$uid.service" 2>/dev/null | tr -d '\r')" = active ]; }
if wait_for 60 user_manager_up; then
  pass "enable-linger started user@$uid.service"
else
  in_ctr systemctl status --no-pager "user@$uid.service" | tail -n 20
  fail "the user manager of $user did not start"
fi
user_prop() { as_user systemctl --user show -p "$1" --value reaperd.service 2>/dev/null | tr -d '\r'; }
user_active() { [ "$(user_prop ActiveState)" = active ]; }
if as_user systemctl --user enable --now reaperd >"$work/user-enable.log" 2>&1 && user_active; then
  pass "systemctl --user enable --now reaperd: active once READY (pid $(user_prop MainPID), watchdog $(user_prop WatchdogUSec))"
else
  cat "$work/user-enable.log"
  as_user systemctl --user status --no-pager reaperd | tail -n 20
  in_ctr journalctl --no-pager _SYSTEMD_USER_UNIT=reaperd.service | tail -n 20
  fail "the user unit did not become active"
fi
if as_user test -S "/run/user/$uid/reaperd/control.sock" && as_user test -d "/home/$user/.local/state/reaperd"; then
  pass "its control socket is in XDG_RUNTIME_DIR and its state in ~/.local/state"
else
  fail "no control socket in /run/user/$uid/reaperd or no state in ~/.local/state/reaperd"
fi
user_session=systemd-user-$$
user_victim=$(docker_cli create --network none --label "reaperd.session=$user_session" --name "user-victim-$$" \
  reaperd-systemd-test/busybox:latest sleep 600)
docker_cli start "$user_victim" >/dev/null
sleep 2
as_user reaperctl run "$user_session" -- true || fail "reaperctl run as $user (the socket found by the XDG rule)"
user_victim_gone() { ! docker_cli inspect "$user_victim" >/dev/null 2>&1; }
if wait_for 60 user_victim_gone; then
  pass "the user's reaperd reaped the session's container after its lease"
else
  fail "the user's session container is still there"
  docker_cli rm -f "$user_victim" >/dev/null 2>&1
fi
user_record=""
user_reap_recorded() {
  user_record=$(as_user journalctl --user -u reaperd --no-pager -o json "MESSAGE_ID=$reaped_id" \
    "CONTAINER_ID=$user_victim" 2>/dev/null | tail -n 1)
  [ -n "$user_record" ]
}
if wait_for 30 user_reap_recorded && grep -q "\"SESSION_ID\":\"$user_session\"" <<<"$user_record"; then
  pass "journalctl --user -u reaperd (as $user) shows the reap with MESSAGE_ID, CONTAINER_ID and SESSION_ID"
else
  as_user journalctl --user -u reaperd --no-pager 2>&1 | tail -n 10
  fail "no reap record in journalctl --user -u reaperd as $user"
fi
old_user_pid=$(user_prop MainPID)
as_user systemctl --user kill --kill-whom=main --signal=SIGSTOP reaperd
user_restarted() {
  local pid
  pid=$(user_prop MainPID)
  [ "$pid" != 0 ] && [ "$pid" != "$old_user_pid" ] && user_active
}
if wait_for 90 user_restarted; then
  pass "SIGSTOP: the watchdog restarted the user's reaperd (pid $old_user_pid -> $(user_prop MainPID))"
else
  fail "the user's reaperd was not restarted after SIGSTOP"
fi
# The package installed again while the user's reaperd holds a live session: the user's
# daemon goes on (dpkg restarts the system unit only, as Debian's packages leave running user
# services be) and the live session's container stays; once its holder ends, it is reaped.
# The system unit is kept down meanwhile (policy-rc.d): here the user's engine is the private
# root one, which it would watch too; a rootless user's engine is never the system's.
step "reinstalling the package keeps the user's live session"
in_ctr sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d'
user_live_session=systemd-user-live-$$
hold_with_container "$user_live_session" /tmp/user-hold.pid as_user
user_live=$held_container
user_pid_before=$(user_prop MainPID)
if in_ctr dpkg -i /var/tmp/reaperd.deb >"$work/user-upgrade.log" 2>&1; then
  pass "dpkg -i of the package over itself, the user's reaperd running"
else
  cat "$work/user-upgrade.log"
  fail "dpkg -i (reinstall beside the user's reaperd)"
fi
in_ctr rm -f /usr/sbin/policy-rc.d
# Past the user's lease_grace (1 s) with margin.
sleep 4
if docker_cli inspect "$user_live" >/dev/null 2>&1 && leased "$user_live_session" as_user && user_active; then
  pass "after the reinstall the user's reaperd (pid $user_pid_before, now $(user_prop MainPID)) holds the live session and its container is there"
else
  as_user reaperctl status 2>&1 | head -20
  fail "the user's live session lost its container or its lease after the reinstall"
fi
end_hold_then_reaped /tmp/user-hold.pid "$user_live" "the user's session container"
if as_user systemctl --user stop reaperd && [ "$(user_prop Result)" = success ]; then
  pass "systemctl --user stop: clean"
else
  fail "systemctl --user stop: Result=$(user_prop Result)"
fi

echo "--- the journal of reaperd.service (last 40 lines)"
in_ctr journalctl -u reaperd.service --no-pager | tail -n 40
elapsed=$(($(date +%s) - started))
echo "systemd test took ${elapsed}s"
echo "systemd: $passes passed, $failures failed"
((failures == 0))
