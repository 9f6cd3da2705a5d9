#!/usr/bin/env bash
# End-to-end check of deploy/docker-compose.yml on a host with a container engine: build the image, start the
# learner, 2 inference replicas, the env clients and Prometheus from scratch, wait until they are ready, check
# that both replicas serve sessions and that the learner's mean return rises over that of its first episodes,
# crash the learner (SIGKILL from the host) and check that its restart policy brings it back and that it resumes
# from its checkpoint; then stop the stack (the learner must write its final checkpoint within its grace period)
# and remove it, volumes included. Exit 0 when every check passed, 1 otherwise. Every wait is bounded.
#   deploy/smoke.sh
#   ENGINE=podman COMPOSE="podman-compose" deploy/smoke.sh
#   BUILD_FLAGS="--build-arg PIP_INDEX_URL=https://mirror/simple" deploy/smoke.sh
# Environment: ENGINE (docker) builds the image; COMPOSE ("$ENGINE compose") runs the stack; BUILD_FLAGS go to
# `$ENGINE build`; RISE (1.5) is the factor by which the mean return must grow over that of the learner's first
# 20 episodes, within RISE_TIMEOUT_S (600); BUILD_TIMEOUT_S (1800) bounds the build; PROMETHEUS_IMAGE as in the
# compose file. The stack runs as the compose project rlgate-smoke, so a running `rlgate` stack is left alone
# (an earlier rlgate-smoke one is removed first, volumes included); it needs 127.0.0.1:8001 and :9090.
# deploy/airgap.sh runs this on a Debian host without an engine or an image registry.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${ENGINE:-docker}
read -r -a compose <<<"${COMPOSE:-$ENGINE compose}"
read -r -a build_flags <<<"${BUILD_FLAGS:-}"
rise=${RISE:-1.5}
rise_timeout_s=${RISE_TIMEOUT_S:-600}
build_timeout_s=${BUILD_TIMEOUT_S:-1800}
learner=http://127.0.0.1:8001
prometheus=http://127.0.0.1:9090
work=$(mktemp -d)
stack=("${compose[@]}" -p rlgate-smoke -f deploy/docker-compose.yml)

log() { printf '[smoke %4ds] %s\n' "$SECONDS" "$*"; }
engine() { timeout 120 "$ENGINE" "$@"; } # a question to the engine: answered in moments, or never
fail() {
    log "FAIL: $*"
    timeout 60 "${stack[@]}" ps || true
    timeout 60 "${stack[@]}" logs --tail 30 || true
    exit 1
}
# Stop every service with its own grace period (the learner's is 3 minutes); the learner must get to write its
# final checkpoint.
stop_stack() {
    local started=$SECONDS last
    log "stopping (SIGTERM; each service has its stop_grace_period)"
    stopped=1
    timeout 300 "${stack[@]}" stop >"$work/stop.log" 2>&1 || cat "$work/stop.log"
    last=$(timeout 60 "${stack[@]}" logs --no-log-prefix --tail 1 learner 2>&1)
    log "stopped in $((SECONDS - started))s; the learner's last line: $last"
    [[ $last == *"stopped; final checkpoint"* ]]
}
teardown() {
    [ -n "${stopped:-}" ] || stop_stack || true
    timeout 300 "${stack[@]}" down -v >"$work/down.log" 2>&1 || cat "$work/down.log"
    log "removed containers, network and volumes"
    rm -rf "$work"
}

# prom QUERY: one "instance value" line per series of an instant PromQL query.
prom() {
    python3 - "$prometheus" "$1" <<'EOF'
import json, sys, urllib.parse, urllib.request
url = f"{sys.argv[1]}/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[2]})
for series in json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]:
    print(series["metric"].get("instance", "-"), series["value"][1])
EOF
}

# wait_for SECONDS WHAT COMMAND...: run COMMAND every 5 s until it succeeds, for at most SECONDS. Exit status 1
# means "not yet"; any other failure of COMMAND is final (a check that can no longer pass fails at once).
wait_for() {
    local limit=$1 what=$2 until=$((SECONDS + $1)) status
    shift 2
    log "waiting (at most ${limit}s): $what"
    while true; do
        status=0
        "$@" >"$work/last" 2>&1 || status=$?
        [ "$status" -ne 0 ] || break
        [ "$status" -eq 1 ] || fail "$what: $(tail -3 "$work/last")"
        ((SECONDS < until)) || fail "$what (after ${limit}s): $(tail -3 "$work/last")"
        sleep 5
    done
    log "ok: $what"
}

learner_ready() {
    python3 -c "import urllib.request; urllib.request.urlopen('$learner/readyz', timeout=2)"
}

prometheus_ready() {
    python3 -c "import urllib.request; urllib.request.urlopen('$prometheus/-/ready', timeout=2)"
}

targets_up() {
    python3 - "$prometheus" <<'EOF'
import json, sys, urllib.request
targets = json.load(urllib.request.urlopen(f"{sys.argv[1]}/api/v1/targets", timeout=5))["data"]["activeTargets"]
up = sorted(f'{t["labels"]["job"]}/{t["labels"]["instance"]}' for t in targets if t["health"] == "up")
print(" ".join(up))
assert sum(u.startswith("learner/") for u in up) == 1 and sum(u.startswith("inference/") for u in up) == 2, up
assert len(up) == len(targets), [t["lastError"] for t in targets if t["health"] != "up"]
EOF
}

# Both replicas have open sessions and have served env steps.
both_replicas_serve() {
    prom 'rlgate_sessions > 0 and rlgate_env_steps_total > 0' | tee /dev/stderr | awk 'END { exit NR != 2 }'
}

# The learner's first 20 episodes (whenever they are read: its history keeps them), or exit 2 if it did not
# start from scratch.
baseline_read() {
    python3 deploy/learner_progress.py baseline "$learner" >"$work/baseline"
}

return_rose() {
    python3 deploy/learner_progress.py rose "$learner" "$baseline" "$rise"
}

learner_status() { # learner_status FIELD: one field of the learner's /status
    python3 -c "import json, sys, urllib.request; print(json.load(urllib.request.urlopen('$learner/status', timeout=5))['$1'])"
}

learner_restarted() { # learner_restarted CONTAINER COUNT: the engine restarted it more than COUNT times
    [ "$(engine inspect --format '{{.RestartCount}}' "$1")" -gt "$2" ]
}

learner_resumed() {
    timeout 60 "${stack[@]}" logs --no-log-prefix learner 2>&1 | grep -q "resuming from checkpoint"
}

# Kill the learner's process from the host, as a crash would (OOM, a fatal error): the restart policy must bring
# it back, and it must resume from its checkpoint. `docker kill` would not do: the engine takes it for a stop by
# hand, which no restart policy undoes. Signalling the container's process needs the right to (root, or the
# same user as a rootless engine); without it the check is skipped, and says so.
crash_learner() {
    local container pid restarts
    container=$(timeout 60 "${stack[@]}" ps -q learner)
    pid=$(engine inspect --format '{{.State.Pid}}' "$container")
    restarts=$(engine inspect --format '{{.RestartCount}}' "$container")
    if ! kill -KILL "$pid" 2>"$work/kill"; then
        log "SKIPPED the crash check: cannot signal the learner's process $pid from here ($(cat "$work/kill"))"
        return 0
    fi
    log "killed the learner's process $pid (version $learned, a crash)"
    wait_for 120 "the engine restarts the learner (restart: always)" learner_restarted "$container" "$restarts"
    wait_for 300 "the restarted learner ready" learner_ready
    wait_for 60 "the restarted learner resumed from its checkpoint" learner_resumed
    log "the learner is back at version $(learner_status model_version)"
}

(umask 022 && python3 -c "import secrets; print(secrets.token_hex(32))" >"$work/token")
export RLGATE_TOKEN_SECRET=$work/token
trap teardown EXIT

log "removing what an earlier rlgate-smoke run left (containers, volumes: the learner must start from scratch)"
timeout 300 "${stack[@]}" down -v >"$work/down.log" 2>&1 || cat "$work/down.log"

log "building the image: $ENGINE build ${build_flags[*]} -t rlgate ."
timeout "$build_timeout_s" "$ENGINE" build "${build_flags[@]}" -t rlgate . >"$work/build.log" 2>&1 || {
    tail -30 "$work/build.log"
    fail "image build (at most ${build_timeout_s}s)"
}
log "built: $(engine image inspect rlgate --format '{{.Id}} {{.Size}}')"

log "starting learner, 2 x inference, envs, prometheus"
timeout 600 "${stack[@]}" up -d --no-build --scale inference=2 learner inference envs prometheus \
    >"$work/up.log" 2>&1 || {
    cat "$work/up.log"
    fail "compose up"
}
wait_for 300 "learner ready (/readyz)" learner_ready
wait_for 120 "Prometheus ready" prometheus_ready
wait_for 120 "all Prometheus targets up (learner, 2 inference)" targets_up
log "targets: $(cat "$work/last")"
wait_for 300 "the learner's first 20 episodes (its baseline)" baseline_read
baseline=$(cat "$work/baseline")
log "mean return of the learner's first 20 episodes: $baseline"
wait_for 120 "both inference replicas serve sessions" both_replicas_serve
log "sessions and env steps per replica: $(tr '\n' ';' <"$work/last")"
wait_for "$rise_timeout_s" "mean return rises ${rise}x over the baseline" return_rose
log "$(cat "$work/last")"
learned=$(learner_status model_version)
log "learner model version: $learned; servers: $(prom rlgate_model_version | awk '{ printf "%s ", $2 }'); best checkpoint: $(learner_status best_checkpoint)"
crash_learner
stop_stack || fail "the learner was killed before it wrote its final checkpoint"
log "PASS"
