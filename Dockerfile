# syntax=docker/dockerfile:1
# One image for every rlgate service: `rlgate serve` by default, `rlgate learn` and `rlgate env` as commands.
#   docker build -t rlgate .                                                                  (CPU torch)
#   docker build -t rlgate --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .  (CUDA torch)
# The builder stage makes a venv; the runtime stage gets only that venv, so no build tools or caches ship.

# Both stages must use the same Python: the venv's interpreter links point into the base image.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
# The PyTorch wheel index decides the build: .../whl/cpu (default, small) or .../whl/cu128 (CUDA 12.8).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Torch first and alone: the largest layer, rebuilt only when the pins change, not on every code change.
COPY constraints.txt .
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --constraint constraints.txt --index-url "$TORCH_INDEX_URL" torch
# Then rlgate itself (not editable) with the rest of its dependencies; the installed torch satisfies the pin.
COPY . .
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --constraint constraints.txt .

FROM ${PYTHON_IMAGE}
# A fixed numeric uid, so orchestrators can verify `runAsNonRoot`. /data holds the spool and checkpoints;
# creating them here lets a fresh named volume mounted on them inherit the owner.
RUN useradd --create-home --uid 10001 --user-group rlgate \
    && mkdir -p /data/spool /data/checkpoints \
    && chown -R rlgate:rlgate /data
# Root owns the venv: the service cannot modify its own code.
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    RLGATE_HOST=0.0.0.0
WORKDIR /data
USER 10001
# gRPC and HTTP of the inference server (50051, 8000) and of the learner (50052, 8001).
EXPOSE 50051 8000 50052 8001
# Liveness through the service's own /healthz (slim images have no curl). A service on another HTTP port
# (the learner: 8001) must set RLGATE_HTTP_PORT, as deploy/docker-compose.yml does.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RLGATE_HTTP_PORT', '8000'), timeout=2)"]
CMD ["rlgate", "serve"]
