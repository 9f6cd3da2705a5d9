#!/usr/bin/env bash
# End-to-end check of deploy/docker-compose.yml on a host with a container engine: build the image, start the
# learner, 2 inference replicas, the env clients and Prometheus, wait until they are ready, check that both
# replicas serve sessions, that the learner's mean return rises and that Prometheus has every target up; then
# stop the stack (the learner must write its final checkpoint within its grace period) and remove it, volumes
# included. Exit 0 when every check passed, 1 otherwise.
#   deploy/smoke.sh
#   ENGINE=podman COMPOSE="podman-compose" deploy/smoke.sh
#   BUILD_FLAGS="--build-arg PIP_INDEX_URL=https://mirror/simple" deploy/smoke.sh
# Environment: ENGINE (docker) builds the image; COMPOSE ("$ENGINE compose") runs the stack; BUILD_FLAGS go to
# `$ENGINE build`; SMOKE_TIMEOUT (900) bounds the wait in seconds; RISE (1.5) is the factor by which the mean
# return must grow over its first reading; PROMETHEUS_IMAGE as in the compose file. The stack runs as the
# compose project rlgate-smoke, so a running `rlgate` stack is left alone; it needs 127.0.0.1:8001 and :9090.
# deploy/airgap.sh runs this on a Debian host without an engine or an image registry.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${ENGINE:-docker}
read -r -a compose <<<"${COMPOSE:-$ENGINE compose}"
read -r -a build_flags <<<"${BUILD_FLAGS:-}"
timeout_s=${SMOKE_TIMEOUT:-900}
rise=${RISE:-1.5}
prometheus=http://127.0.0.1:9090
work=$(mktemp -d)
stack=("${compose[@]}" -p rlgate-smoke -f deploy/docker-compose.yml)
deadline=$((SECONDS + timeout_s))

log() { printf '[smoke %4ds] %s\n' "$SECONDS" "$*"; }
fail() {
    log "FAIL: $*"
    "${stack[@]}" ps || true
    "${stack[@]}" logs --tail 30 || true
    exit 1
}
# Stop every service with its own grace period; the learner must get to write its final checkpoint.
stop_stack() {
    local started=$SECONDS last
    log "stopping (SIGTERM; each service has its stop_grace_period)"
    stopped=1
    "${stack[@]}" stop >"$work/stop.log" 2>&1 || cat "$work/stop.log"
    last=$("${stack[@]}" logs --no-log-prefix --tail 1 learner 2>&1)
    log "stopped in $((SECONDS - started))s; the learner's last line: $last"
    [[ $last == *"stopped; final checkpoint"* ]]
}
teardown() {
    [ -n "${stopped:-}" ] || stop_stack || true
    "${stack[@]}" down -v >"$work/down.log" 2>&1 || cat "$work/down.log"
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

# wait_for WHAT COMMAND...: run COMMAND every 5 s until it succeeds or the deadline passes.
wait_for() {
    local what=$1
    shift
    log "waiting: $what"
    until "$@" >"$work/last" 2>&1; do
        ((SECONDS < deadline)) || fail "$what (after ${timeout_s}s): $(tail -3 "$work/last")"
        sleep 5
    done
    log "ok: $what"
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

return_rose() {
    local now
    now=$(prom rlgate_learner_mean_return | awk '{ print $2 }')
    echo "mean return $now (first reading $first_return, needs > $rise x)"
    python3 -c "import sys; sys.exit(not float('$now') > $rise * float('$first_return'))"
}

first_return_read() {
    first_return=$(prom 'rlgate_learner_mean_return > 0' | awk '{ print $2 }')
    [ -n "$first_return" ]
}

(umask 022 && python3 -c "import secrets; print(secrets.token_hex(32))" >"$work/token")
export RLGATE_TOKEN_SECRET=$work/token
trap teardown EXIT

log "building the image: $ENGINE build ${build_flags[*]} -t rlgate ."
"$ENGINE" build "${build_flags[@]}" -t rlgate . >"$work/build.log" 2>&1 || {
    tail -30 "$work/build.log"
    fail "image build"
}
log "built: $("$ENGINE" image inspect rlgate --format '{{.Id}} {{.Size}}')"

log "starting learner, 2 x inference, envs, prometheus"
"${stack[@]}" up -d --no-build --scale inference=2 learner inference envs prometheus >"$work/up.log" 2>&1 || {
    cat "$work/up.log"
    fail "compose up"
}
wait_for "learner ready (/readyz)" python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8001/readyz', timeout=2)"
wait_for "Prometheus ready" python3 -c "import urllib.request; urllib.request.urlopen('$prometheus/-/ready', timeout=2)"
wait_for "all Prometheus targets up (learner, 2 inference)" targets_up
log "targets: $(cat "$work/last")"
wait_for "a first mean return" first_return_read
log "first mean return: $first_return"
wait_for "both inference replicas serve sessions" both_replicas_serve
log "sessions and env steps per replica: $(tr '\n' ';' <"$work/last")"
wait_for "mean return rises ${rise}x" return_rose
log "$(cat "$work/last")"
log "learner model version: $(prom rlgate_learner_model_version | awk '{ print $2 }'); servers: $(prom rlgate_model_version | awk '{ printf "%s ", $2 }')"
stop_stack || fail "the learner was killed before it wrote its final checkpoint"
log "PASS"
