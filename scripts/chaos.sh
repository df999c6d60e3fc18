#!/usr/bin/env bash
# The chaos run (issue 7): a private engine, reaperd behind a fault-injecting proxy, and a
# churn of sessions while faults are injected; at the end a table of checks. Run as root.
#
#   scripts/chaos.sh                  ~210 s of faults (~5 min in all with a warm build)
#   scripts/chaos.sh --seconds N      aim for N seconds of faults (at least 60); the schedule
#                                     keeps calm gaps after each restart (the engine takes
#                                     ~20 s to come back from a SIGKILL here), so a run lasts
#                                     at least ~190 s whatever N
#   scripts/chaos.sh --seed S         replay a run: the seed drives the fault schedule, the
#                                     proxy's draws and the driver's churn (timing still varies)
#   scripts/chaos.sh --build-dir DIR  build there instead of build/
#   scripts/chaos.sh --keep           keep the temp dir with every log also when the run passes
#
# What runs: tests/harness/engine-guard (a private dockerd), tests/chaos/fault_proxy on a
# unix socket in front of it, reaperd pointed at the proxy (lease_grace 3s, 2MiB log caps,
# 5s request timeout, short retries and resyncs), and tests/chaos/chaos_driver, which talks to
# the engine directly and to reaperd's control socket: sessions leased, dropped, ended,
# orphans reported, log spammers, unlabeled and never-leased containers, two sessions leased
# for the whole run. Faults, on a schedule: the proxy's modes rotate every 8-15 s (409/500 on
# DELETE, 500s, slow, hung and half-closed answers, garbled and cut event lines); reaperd is
# SIGKILLed and restarted (early on, so the last instance lives through most of the run); the
# engine is SIGKILLed and restarted (once together with reaperd); the state dir is made
# read-only for a while (a read-only bind mount; root ignores chmod); and a stall window
# holds every DELETE past reaperd's request timeout for 30 s (issue 23), after which the
# reaps it held back must still be done in time. Every fault is logged
# with its time in faults.log, which the driver reads.
#
# The checks (printed as a table by the driver): every container of a dropped or ended
# session, or reported as an orphan, is gone within lease_grace + 60 s after the faults end
# (and none of a dropped session before its lease_grace); no unlabeled, leased or never-leased
# container was removed, by the engine's own destroy events and by a final list; the
# spammers' logs (plus rotated files) stay within 2x the cap in every sample taken while a
# reaperd runs, its start-up (re-listing through the faulty proxy, up to 43 s) and engine
# restarts included: it caps the logs known from its last run from its start (only the
# samples when no reaperd exists, and its first second, are left out; the largest size seen
# at all is printed too); the longest-lived reaperd's fd count and
# RSS do not grow. Samples are kept as CSV in the temp dir (with --keep or on failure).
# Exit 0 when every check held, 1 otherwise (the logs' tails are printed and the temp dir is
# kept), 64 on a usage error. Everything started here is stopped by its pid, also on failure
# or interruption.
set -euo pipefail
cd "$(dirname "$0")/.."

help_text() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
usage() { help_text >&2; exit 64; }

seconds=210
build=build
seed=""
keep=false
while (($#)); do
  case "$1" in
    --seconds) (($# >= 2)) || usage; seconds=$2; shift ;;
    --seed) (($# >= 2)) || usage; seed=$2; shift ;;
    --build-dir) (($# >= 2)) || usage; build=$2; shift ;;
    --keep) keep=true ;;
    -h|--help) help_text; exit 0 ;;
    *) echo "chaos: unknown argument $1" >&2; usage ;;
  esac
  shift
done
[[ "$seconds" =~ ^[0-9]+$ ]] && ((seconds >= 60)) || { echo "chaos: --seconds takes a whole number >= 60" >&2; exit 64; }
[ -z "$seed" ] || [[ "$seed" =~ ^[0-9]+$ ]] || { echo "chaos: --seed takes a number" >&2; exit 64; }
[ "$(id -u)" = 0 ] || { echo "chaos: needs root (a private engine, bind mounts)" >&2; exit 1; }

started_at=$(date +%s)
scripts/deps.sh
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target reaperd reaperctl fault_proxy chaos_driver
build=$(cd "$build" && pwd)

[ -n "$seed" ] || seed=$(( $(od -An -N2 -tu2 /dev/urandom) ))
RANDOM=$seed
echo "chaos: seed $seed (replay with: scripts/chaos.sh --seconds $seconds --seed $seed)"

work=$(mktemp -d /tmp/reaperd-chaos.XXXXXX)
chmod 755 "$work"
state=$work/state
mkdir -p "$state"
faults=$work/faults.log
: >"$faults"
guard_pid=""; guard_in=""; guard_out=""; engine_dir=""
proxy_pid=""; reaperd_pid=""; driver_pid=""
verdict=1

stop_pid() {  # stop_pid PID SECONDS: SIGTERM, wait, SIGKILL
  local pid=$1 limit=$2 i
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < limit * 20; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

tails() {
  local f
  for f in driver.log reaperd.log proxy.log dockerd.log; do
    [ -s "$work/$f" ] || continue
    echo "---- last lines of $work/$f"
    tail -n 40 "$work/$f"
  done
  echo "---- faults: $faults"
  cat "$faults"
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  stop_pid "$driver_pid" 5
  stop_pid "$reaperd_pid" 10
  stop_pid "$proxy_pid" 5
  if mountpoint -q "$state"; then umount "$state" || umount -l "$state"; fi
  [ -n "$engine_dir" ] && cp "$engine_dir/dockerd.log" "$work/dockerd.log" 2>/dev/null
  if [ -n "$guard_in" ]; then
    # EOF on its stdin: engine-guard stops the engine by its pid and removes its dir.
    exec {guard_in}>&-
    wait "$guard_pid" 2>/dev/null
  fi
  if [ "$status" = 0 ] && [ "$verdict" = 0 ]; then
    if $keep; then echo "chaos: logs kept in $work"; else rm -rf "$work"; fi
  else
    tails
    echo "chaos: FAILED; logs kept in $work (driver.log, reaperd.log, proxy.log, dockerd.log, faults.log)"
    [ "$status" = 0 ] && status=1
  fi
  echo "chaos: wall time $(( $(date +%s) - started_at )) s"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_ms() { date +%s%3N; }
fault() { echo "$(now_ms) $*" >>"$faults"; echo "chaos: $(date +%T) $*"; }

# ---- the engine --------------------------------------------------------------------------
coproc GUARD { exec tests/harness/engine-guard; }
guard_pid=$GUARD_PID
guard_in=${GUARD[1]}
guard_out=${GUARD[0]}
engine_answer() { local line=""; read -r -t 120 line <&"$guard_out" || true; echo "$line"; }
line=$(engine_answer)
case "$line" in
  "ready "*) engine_dir=${line#ready } ;;
  *) echo "chaos: the private engine did not start: $line" >&2; exit 1 ;;
esac
engine_sock=$engine_dir/docker.sock
echo "chaos: engine in $engine_dir"
engine_kill() { fault engine-kill; echo kill >&"$guard_in"; [ "$(engine_answer)" = killed ]; }
engine_start() {
  echo start >&"$guard_in"
  local line
  line=$(engine_answer)
  case "$line" in
    "ready "*) fault engine-up ;;
    *) echo "chaos: the engine did not restart: $line" >&2; return 1 ;;
  esac
}

# ---- the proxy -------------------------------------------------------------------------
mode_file=$work/proxy.mode
: >"$mode_file"
"$build/tests/chaos/fault_proxy" --listen "$work/proxy.sock" --upstream "$engine_sock" \
  --mode-file "$mode_file" --stats "$work/proxy.stats" --seed "$seed" \
  </dev/null >>"$work/proxy.log" 2>&1 &
proxy_pid=$!
for _ in $(seq 1 100); do [ -S "$work/proxy.sock" ] && break; sleep 0.1; done
[ -S "$work/proxy.sock" ] || { echo "chaos: the proxy did not start" >&2; exit 1; }

declare -A modes=(
  [none]=""
  [delete_409]=$'delete_409 0.6'
  [delete_500]=$'delete_500 0.5\nerror_500 0.1'
  [slow]=$'slow 0.5\nslow_ms 3000'
  [hang]=$'hang 0.08'
  [halfclose]=$'halfclose 0.15'
  [garble]=$'garble 0.25'
  [mixed]=$'delete_409 0.2\ndelete_500 0.2\nerror_500 0.05\nslow 0.2\nslow_ms 1500\nhang 0.03\nhalfclose 0.05\ngarble 0.05'
  [stall]=$'delete_hang 1'
)
mode_names=(none delete_409 delete_500 slow hang halfclose garble mixed)
# The modes come in shuffled rounds (each once per round), so every kind of fault is
# injected in a run of the default length whatever the seed.
mode_queue=()
rotate_mode() {
  if ((${#mode_queue[@]} == 0)); then
    mode_queue=("${mode_names[@]}")
    local i j tmp
    for ((i = ${#mode_queue[@]} - 1; i > 0; i--)); do
      j=$((RANDOM % (i + 1)))
      tmp=${mode_queue[i]}; mode_queue[i]=${mode_queue[j]}; mode_queue[j]=$tmp
    done
  fi
  set_mode "${mode_queue[0]}"
  mode_queue=("${mode_queue[@]:1}")
}
set_mode() {
  printf '%s\n' "${modes[$1]}" >"$mode_file.tmp"
  mv "$mode_file.tmp" "$mode_file"
  fault proxy-mode "$1"
}

# ---- reaperd ----------------------------------------------------------------------------
config=$work/reaperd.yaml
cat >"$config" <<EOF
engine:
  host: unix://$work/proxy.sock
  request_timeout: 5s
control:
  socket: $work/control.sock
state:
  dir: $state
sessions:
  labels: [reaperd.session]
  lease_grace: 3s
reaper:
  resync_interval: 10s
  retry_initial: 200ms
  retry_max: 2s
logs:
  max_size: 2MiB
EOF
"$build/daemon/reaperd" --check-config --config "$config" >/dev/null
reaperd_start() {
  echo "==== reaperd started $(date +%T)" >>"$work/reaperd.log"
  REAPERD_LOG_TARGET=stderr "$build/daemon/reaperd" --config "$config" </dev/null >>"$work/reaperd.log" 2>&1 &
  reaperd_pid=$!
  echo "$reaperd_pid" >"$work/reaperd.pid"
  fault reaperd-up "$reaperd_pid"
}
reaperd_kill() {
  fault reaperd-kill "$reaperd_pid"
  kill -KILL "$reaperd_pid"
  wait "$reaperd_pid" 2>/dev/null || true
  reaperd_pid=""
}
reaperd_start

# ---- the driver ----------------------------------------------------------------------
"$build/tests/chaos/chaos_driver" --engine "$engine_sock" --control "$work/control.sock" \
  --faults-log "$faults" --reaperd-pid "$work/reaperd.pid" --proxy-stats "$work/proxy.stats" \
  --seed "$seed" --lease-grace-ms 3000 --log-cap $((2 << 20)) --log-bound $((4 << 20)) \
  --reap-deadline-ms 60000 --out-dir "$work" </dev/null >"$work/driver.out" 2>"$work/driver.log" &
driver_pid=$!

# ---- the fault schedule -----------------------------------------------------------------
t0=$(date +%s)
next_mode=$((t0 + 5))
check_alive() {
  if ! kill -0 "$driver_pid" 2>/dev/null; then
    local status=0
    wait "$driver_pid" || status=$?
    driver_pid=""
    echo "chaos: the driver exited early, status $status" >&2
    cat "$work/driver.out"
    exit 1
  fi
  if [ -n "$reaperd_pid" ] && ! kill -0 "$reaperd_pid" 2>/dev/null; then
    echo "chaos: reaperd exited by itself" >&2; exit 1
  fi
}
# wait_until PERCENT CALM: sleeps until PERCENT of the run has passed and at least CALM
# seconds since the last step ended, rotating the proxy's mode every 8-15 s meanwhile. The
# calm periods give each reaperd instance and engine restart settled time (the engine takes
# ~20 s to come back after a SIGKILL here), so a run can take longer than --seconds.
last_step=$t0
wait_until() {
  local target=$((t0 + seconds * $1 / 100)) calm_end=$((last_step + $2))
  ((calm_end > target)) && target=$calm_end
  while (( $(date +%s) < target )); do
    check_alive
    if (( $(date +%s) >= next_mode )); then
      rotate_mode
      next_mode=$(( $(date +%s) + 8 + RANDOM % 8 ))
    fi
    sleep 0.5
  done
}
step_done() { last_step=$(date +%s); }

wait_until 10 15
reaperd_kill; sleep $((1 + RANDOM % 2)); reaperd_start; step_done
wait_until 25 15
# Both at once: reaperd comes back while the engine is still down and must wait for it.
reaperd_kill; engine_kill; reaperd_start; sleep 3; engine_start; step_done
wait_until 40 12
# The last reaperd kill: the instance started here lives through the rest of the run, and
# its fds and RSS are compared early vs late.
reaperd_kill; sleep 1; reaperd_start; step_done
wait_until 50 25
mount --bind "$state" "$state"
mount -o remount,bind,ro "$state"
fault state-ro
step_done
wait_until 0 5
# The engine restarts while reaperd cannot save its state.
engine_kill; sleep 2; engine_start; step_done
wait_until 0 5
umount "$state"
fault state-rw
step_done
wait_until 60 5
# The stall window: every DELETE hangs for 30 s, the mode rotation held off meanwhile.
set_mode stall
step_done
next_mode=$(( $(date +%s) + 30 ))
wait_until 0 30
set_mode none
fault stall-end
step_done
wait_until 75 20
engine_kill; sleep 1; engine_start; step_done
wait_until 100 25
set_mode none
fault faults-end

# ---- the verdict ----------------------------------------------------------------------------
# The driver now waits for the orphans (lease_grace + 60 s at most), checks, prints its table.
for _ in $(seq 1 300); do kill -0 "$driver_pid" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$driver_pid" 2>/dev/null; then
  echo "chaos: the driver did not finish within 150 s of the faults' end" >&2
  exit 1
fi
set +e
wait "$driver_pid"
verdict=$?
set -e
driver_pid=""
cat "$work/driver.out"
[ "$verdict" = 0 ] || exit 1
