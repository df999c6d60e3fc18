#!/usr/bin/env bash
# The main-job command: on a fresh Debian 12 machine as root, installs what is missing,
# builds reaperd, starts a private Docker engine (or uses one that is already running),
# starts reaperd on it with a temp config, plays three incidents and shows reaperd handling
# them, prints a PASS/FAIL summary and stops everything it started.
#
#   scripts/demo.sh                          a private engine in a temp dir (the default)
#   scripts/demo.sh --engine unix:///var/run/docker.sock
#                                            an engine that is already running (also a bare
#                                            socket path or tcp://HOST:PORT); the demo then
#                                            imports its busybox image only if missing and
#                                            removes only the containers (and image) it made
#   scripts/demo.sh --build-dir DIR          build there instead of build/
#
# The incidents:
#   (a) a session holds a lease and runs a container; a plain DELETE of it answers 409
#       (it is running), then the session's owner dies: reaperd reaps the container once
#       lease_grace (2s here) has passed;
#   (b) a session is ended explicitly (`reaperctl end`): its containers go at once, even
#       though its lease is still held;
#   (c) a container without a session label: reaperd never touches it.
# Exit status: 0 when every expectation held, 1 when one failed, 64 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

help_text() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
usage() { help_text >&2; exit 64; }

engine_arg=""
build=build
while (($#)); do
  case "$1" in
    --engine) (($# >= 2)) || usage; engine_arg=$2; shift ;;
    --engine=*) engine_arg=${1#--engine=} ;;
    --build-dir) (($# >= 2)) || usage; build=$2; shift ;;
    -h|--help) help_text; exit 0 ;;
    *) echo "demo: unknown argument $1" >&2; usage ;;
  esac
  shift
done

# ---- narration and expectations --------------------------------------------------------
bold=""; dim=""; plain=""
if [ -t 1 ]; then bold=$'\e[1m'; dim=$'\e[2m'; plain=$'\e[0m'; fi
say() { printf '%s\n' "$bold==> $*$plain"; }
note() { printf '    %s\n' "$*"; }
show() { sed "s/^/    $dim|$plain /"; }  # indent a command's output
results=()
failures=0
expect() {  # expect "what was expected" COMMAND...: records PASS or FAIL
  local what=$1; shift
  if "$@"; then results+=("PASS  $what"); note "ok: $what"
  else results+=("FAIL  $what"); note "FAILED: $what"; failures=$((failures + 1)); fi
}

# ---- 1. dependencies and build ----------------------------------------------------------
say "Installing what is missing (scripts/deps.sh)"
if [ "$(id -u)" = 0 ]; then scripts/deps.sh; else note "not root: skipping scripts/deps.sh"; fi

say "Building reaperd and reaperctl into $build/ (by default the tree scripts/test.sh uses)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target reaperd reaperctl
build=$(cd "$build" && pwd)
reaperd_bin=$build/daemon/reaperd
reaperctl_bin=$build/cli/reaperctl

# ---- 2. cleanup of everything this script starts ----------------------------------------
work=$(mktemp -d /tmp/reaperd-demo.XXXXXX)
chmod 755 "$work"
guard_pid=""; guard_in=""; reaperd_pid=""
holder_pids=()
created_containers=()  # removed at exit from a pre-existing engine
imported_image=false
engine_private=true

stop_pid() {  # stop_pid PID SECONDS: SIGTERM, wait, SIGKILL
  local pid=$1 limit=$2 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < limit * 20; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  for pid in "${holder_pids[@]}"; do stop_pid "$pid" 2; done
  [ -n "$reaperd_pid" ] && stop_pid "$reaperd_pid" 25
  if ! $engine_private; then
    for id in "${created_containers[@]}"; do
      docker_cli rm -f -v "$id" >/dev/null 2>&1
    done
    $imported_image && docker_cli image rm "$image" >/dev/null 2>&1
  fi
  if [ -n "$guard_in" ]; then
    # EOF on its stdin: engine-guard stops the engine by its pid and removes its dir.
    exec {guard_in}>&-
    wait "$guard_pid" 2>/dev/null
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- 3. the engine ----------------------------------------------------------------------
if [ -z "$engine_arg" ]; then
  [ "$(id -u)" = 0 ] || { echo "demo: a private engine needs root (or pass --engine ADDRESS)" >&2; exit 1; }
  say "Starting a private Docker engine (its own temp dir, vfs, no network)"
  coproc GUARD { exec tests/harness/engine-guard; }
  guard_pid=$GUARD_PID
  guard_in=${GUARD[1]}
  guard_out=${GUARD[0]}
  line=""
  read -r -t 120 line <&"$guard_out" || true
  case "$line" in
    "ready "*) engine_dir=${line#ready } ;;
    *) echo "demo: the private engine did not start: $line" >&2; exit 1 ;;
  esac
  engine="unix://$engine_dir/docker.sock"
  note "engine: $engine"
else
  engine_private=false
  case "$engine_arg" in
    unix://*|tcp://*) engine=$engine_arg ;;
    /*) engine="unix://$engine_arg" ;;
    *) echo "demo: --engine takes unix:///PATH, /PATH or tcp://HOST:PORT, not $engine_arg" >&2; exit 64 ;;
  esac
  say "Using the engine already running at $engine"
fi

docker_cli() { docker -H "$engine" "$@"; }
# A raw engine API call, to show the engine's own answer.
engine_api() {  # engine_api METHOD PATH: prints the body, then "HTTP <code>"
  local method=$1 path=$2
  case "$engine" in
    unix://*) curl -sS --unix-socket "${engine#unix://}" -X "$method" -w '\nHTTP %{http_code}\n' "http://engine$path" ;;
    tcp://*) curl -sS -X "$method" -w '\nHTTP %{http_code}\n' "http://${engine#tcp://}$path" ;;
  esac
}

docker_cli version --format 'engine {{.Server.Version}} (API {{.Server.APIVersion}})' | show

image=reaperd-demo/busybox:latest
if docker_cli image inspect "$image" >/dev/null 2>&1; then
  note "image $image is already there"
else
  say "Making the busybox image offline (busybox-static + symlinks, docker import)"
  rootfs=$work/rootfs
  mkdir -p "$rootfs/bin" "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  for tool in sh sleep echo cat true false ls kill; do ln -s busybox "$rootfs/bin/$tool"; done
  tar -C "$rootfs" -c . | docker_cli import - "$image" >/dev/null
  imported_image=true
  rm -rf "$rootfs"
  note "imported $image"
fi

run_id="demo$$"
# Asked over the API rather than with the docker CLI: a poll then costs milliseconds, so the
# times measured below are reaperd's, not the CLI's start-up.
container_json() { engine_api GET "/containers/$1/json" 2>/dev/null; }
container_exists() { container_json "$1" | tail -n 1 | grep -q '^HTTP 200$'; }
container_running() { container_json "$1" | grep -q '"Running":true'; }
start_container() {  # start_container VAR NAME [LABEL...]: runs `sleep 1000`, its id in VAR
  local var=$1 name=$2 id args=()
  shift 2
  for label in "$@"; do args+=(--label "$label"); done
  id=$(docker_cli run -d --network none --name "$name" "${args[@]}" "$image" sleep 1000)
  created_containers+=("$id")
  printf -v "$var" '%s' "$id"
}

# ---- 4. reaperd -------------------------------------------------------------------------
say "Starting reaperd on it (temp config, state dir and control socket; lease_grace 2s)"
socket=$work/control.sock
config=$work/reaperd.yaml
log=$work/reaperd.log
mkdir -p "$work/state"
cat >"$config" <<EOF
engine:
  host: $engine
control:
  socket: $socket
state:
  dir: $work/state
sessions:
  labels: [reaperd.session]
  lease_grace: 2s
reaper:
  retry_initial: 200ms
  retry_max: 2s
logs:
  # Log caps are not part of this demo; off, so nothing on a shared engine is touched.
  max_size: 0
EOF
show <"$config"
"$reaperd_bin" --check-config --config "$config" | show
REAPERD_LOG_TARGET=stderr "$reaperd_bin" --config "$config" </dev/null >"$log" 2>&1 &
reaperd_pid=$!
note "reaperd pid $reaperd_pid, control socket $socket"

ctl() { "$reaperctl_bin" --socket "$socket" "$@"; }
status_json() { ctl status --json 2>/dev/null || true; }
session_entry() {  # the session's object in reaperd's status JSON ("" if not listed)
  status_json | grep -o "{[^{}]*\"id\":\"$1\"[^{}]*}" || true
}
session_state() { session_entry "$1" | grep -o '"state":"[a-z]*"' | cut -d'"' -f4 || true; }
wait_for() {  # wait_for SECONDS COMMAND...: polls every 50 ms until COMMAND succeeds
  local deadline=$(( $(now_ms) + $1 * 1000 )); shift
  until "$@"; do
    (( $(now_ms) < deadline )) || return 1
    sleep 0.05
  done
}
reaperd_ready() { status_json | grep -q '"ready":true'; }
gone() { ! container_exists "$1"; }
now_ms() { date +%s%3N; }

if ! wait_for 30 reaperd_ready; then
  echo "demo: reaperd did not become ready; its log:" >&2
  cat "$log" >&2
  exit 1
fi
note "reaperd is ready: it listed the engine's containers and follows its events"

# ---- 5. the incidents -------------------------------------------------------------------
s1="$run_id-s1"; s2="$run_id-s2"

say "(c) A container with no session label: reaperd must never touch it"
start_container keep "$run_id-unlabeled"
note "started ${keep:0:12} (no labels), running sleep 1000"

say "(a) Session $s1 holds a lease and runs a container"
# Started directly (not through the ctl function), so that $! is reaperctl itself.
"$reaperctl_bin" --socket "$socket" hold "$s1" &
holder_a=$!
holder_pids+=("$holder_a")
expect "session $s1 is leased while its owner lives" wait_for 10 eval '[ "$(session_state "$s1")" = leased ]'
start_container a "$run_id-s1-db" "reaperd.session=$s1"
note "started ${a:0:12} with label reaperd.session=$s1 (the owner is 'reaperctl hold', pid $holder_a)"
note "The owner's cleanup tries a plain delete; the engine refuses it because the container runs:"
note "\$ curl --unix-socket ... -X DELETE /containers/${a:0:12}"
engine_api DELETE "/containers/$a" | show
expect "the plain DELETE failed and the container is still running" container_running "$a"
note "Now the owner dies before it can retry (SIGKILL, no goodbye to reaperd):"
{ kill -KILL "$holder_a"; wait "$holder_a"; } 2>/dev/null || true
killed_at=$(now_ms)
expect "session $s1 goes into its lease_grace" wait_for 5 eval '[ "$(session_state "$s1")" = grace ]'
note "status right after the death: session $s1 is '$(session_state "$s1")'; the container stays for now"
expect "reaperd reaped ${a:0:12} after lease_grace" wait_for 30 gone "$a"
reaped_after=$(( $(now_ms) - killed_at ))
note "gone $reaped_after ms after its owner died (lease_grace 2000 ms)"
expect "the container was kept during the grace (a reconnecting owner would keep it)" \
  test "$reaped_after" -ge 1800

say "(b) Session $s2 is ended explicitly while its lease is still held"
"$reaperctl_bin" --socket "$socket" hold "$s2" &
holder_b=$!
holder_pids+=("$holder_b")
wait_for 10 eval '[ "$(session_state "$s2")" = leased ]' || true
start_container b1 "$run_id-s2-web" "reaperd.session=$s2"
start_container b2 "$run_id-s2-cache" "reaperd.session=$s2"
note "started ${b1:0:12} and ${b2:0:12} with label reaperd.session=$s2"
# Not needed for correctness (an ended session's later containers are reaped too), but it
# makes the time measured below the reaping alone.
wait_for 10 eval 'session_entry "$s2" | grep -q "\"containers\":2[,}]"' || true
note "\$ reaperctl end $s2"
ended_at=$(now_ms)
ctl end "$s2" 2>&1 | show
expect "reaperd reaped both containers of $s2 promptly (no grace)" wait_for 20 eval 'gone "$b1" && gone "$b2"'
note "both gone $(( $(now_ms) - ended_at )) ms after the end"
stop_pid "$holder_b" 2

say "(c) The unlabeled container, after all this"
expect "the unlabeled container ${keep:0:12} is still running" container_running "$keep"
expect "reaperd's log never names the unlabeled container" eval '! grep -q "${keep:0:12}" "$log"'

# ---- 6. what reaperd says ---------------------------------------------------------------
say "reaperctl status"
ctl status 2>&1 | show
say "reaperd's log (the lines about these sessions)"
grep -E "$s1|$s2|ready" "$log" | sed 's/^<[0-9]>//' | show || true
expect "reaperd logged both sessions' ends and three reaps" \
  eval '[ "$(grep -c "container reaped" "$log")" -ge 3 ] && grep -q "SESSION_ID=$s1" "$log" && grep -q "SESSION_ID=$s2" "$log"'
expect "reaperd is still running" kill -0 "$reaperd_pid"

# ---- 7. summary -------------------------------------------------------------------------
say "Summary"
for r in "${results[@]}"; do note "$r"; done
if ((failures)); then
  note "$failures expectation(s) failed; reaperd's full log:"
  show <"$log"
  say "FAIL"
  exit 1
fi
if $engine_private; then
  say "PASS: every expectation held; stopping reaperd and the engine"
else
  say "PASS: every expectation held; stopping reaperd, removing the demo's containers and image"
fi
