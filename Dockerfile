# One image for every rlgate service: `rlgate serve` by default, `rlgate learn` and `rlgate env` as commands.
#   docker build -t rlgate .                             CPU torch (requirements/cpu.txt)
#   docker build -t rlgate:cuda --build-arg TORCH=cuda .  CUDA torch (requirements/cuda.txt)
# Plain Dockerfile syntax, no `# syntax=` line and no RUN --mount: the classic builder, BuildKit and buildah
# (`podman build --format docker`: its default OCI format drops HEALTHCHECK) build it alike, and nothing is
# pulled but the base image. Behind a proxy or offline:
#   --build-arg PIP_INDEX_URL=https://mirror/simple --build-arg PIP_EXTRA_INDEX_URL=https://mirror/torch-cpu
# and a CA that pip must trust (a TLS-inspecting proxy, a private mirror) as build-ca.pem at the repository root.
# The builder stage makes a venv; the runtime stage gets only that venv, so no build tools, caches or CA ship.

# Both stages must use the same Python: the venv's interpreter links point into the base image.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
# Where pip looks (build args are environment variables of every RUN below): PyPI, and PyTorch's CPU index
# for the CPU build of torch that requirements/cpu.txt pins.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# cpu or cuda: the lock file to install, requirements/$TORCH.txt.
ARG TORCH=cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The locked dependencies first and alone: this layer is rebuilt when a lock changes, not on every code change.
# `build-ca.pem*` copies the CA when the context has one and nothing otherwise (a glob may match nothing as
# long as another source exists), which every builder accepts, unlike a BuildKit-only secret mount.
COPY requirements/ build-ca.pem* /tmp/build/
RUN if [ -f /tmp/build/build-ca.pem ]; then \
        cat /etc/ssl/certs/ca-certificates.crt /tmp/build/build-ca.pem > /tmp/build/ca.pem \
        && export PIP_CERT=/tmp/build/ca.pem; \
    fi \
    && pip install --require-hashes --no-deps --requirement "/tmp/build/${TORCH}.txt"
# Then rlgate itself, without its dependencies (they are all installed, hashes checked) and with the locked
# setuptools as its build backend (no isolated build environment, so nothing unlocked is fetched).
WORKDIR /src
COPY . .
RUN pip install --no-deps --no-build-isolation . \
    && pip check

FROM ${PYTHON_IMAGE}
# A fixed numeric uid, so orchestrators can verify `runAsNonRoot`. /data holds the spool and checkpoints;
# creating them here lets a fresh named volume mounted on them inherit the owner.
RUN useradd --create-home --uid 10001 --user-group rlgate \
    && mkdir -p /data/spool /data/checkpoints \
    && chown -R rlgate:rlgate /data
# Root owns the venv: the service cannot modify its own code.
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RLGATE_HOST=0.0.0.0
WORKDIR /data
USER 10001
# gRPC and HTTP of the inference server (50051, 8000) and of the learner (50052, 8001).
EXPOSE 50051 8000 50052 8001
# Readiness through the service's own /readyz (slim images have no curl): an inference server is ready once it
# has the learner's weights, which is what env clients wait for. A service on another HTTP port (the learner:
# 8001) must set RLGATE_HTTP_PORT, as deploy/docker-compose.yml does.
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('RLGATE_HTTP_PORT', '8000'), timeout=2)"]
CMD ["rlgate", "serve"]
