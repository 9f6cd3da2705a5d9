"""Settings of the inference server: environment variables `RLGATE_*`, overridden by `rlgate serve` flags."""

import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, ByteSize, Field, FilePath

from rlgate.service.settings import BackendSettings, Directory, ServiceSettings, grpc_target


class ServerSettings(ServiceSettings, BackendSettings):
    """Every knob of `rlgate serve`: `RLGATE_MAX_BATCH_SIZE=64` equals `--max-batch-size 64`."""

    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one (logged at start).")
    http_port: int = Field(8000, ge=0, le=65535, description="HTTP port for /healthz /readyz /status /metrics.")
    workers: int = Field(
        1,
        ge=1,
        description="Server processes sharing the gRPC port (SO_REUSEPORT: the kernel spreads connections over "
        "them), each with its own sessions, batcher, learner link (server id <server_id>-w<i>) and HTTP port "
        "(http_port + i: one scrape target per worker; 0: each a free one). For machines with many cores.",
    )
    env: str | None = Field(
        None,
        description="Without a learner or checkpoint: serve a fresh model for this env (an id as in a run spec's "
        "env.id); unset: for the first session's spaces.",
    )
    config: FilePath | None = Field(
        None,
        description="Without a learner or checkpoint: a run spec file (.toml/.yaml/.json) whose env, model and "
        "connector pieces the fresh model is built with (--env overrides its env.id). With --learner: the "
        "learner's run spec (with a seed), whose version 0 this server then serves at once instead of waiting "
        "for the learner's first weights.",
    )
    checkpoint: Path | None = Field(
        None, description="Serve the policy in this checkpoint directory (its run spec says how to build it)."
    )
    learner: Annotated[str, AfterValidator(grpc_target)] | None = Field(
        None, description="host:port of the learner: episodes go there and weights come from there."
    )
    learner_tls_ca: FilePath | None = Field(
        None, description="PEM CA to verify the learner by; set when the learner serves TLS (its tls_cert)."
    )
    episode_dir: Directory | None = Field(
        None,
        description="Also write every shipped episode chunk as an rlgate.v1.Episode file here, with metadata.json "
        "(spaces, run spec) beside them: offline data, read back by `rlgate episodes DIR` and rlgate.read_episodes.",
    )
    spool_dir: Directory = Field(
        Path("spool"),
        description="Episodes waiting for the learner's ack are kept here, so a crash loses none.",
    )
    max_spool: ByteSize = Field(
        ByteSize(1 << 30),
        description="Most bytes the spool may hold (e.g. 512MiB): when full, sampling pauses until the learner "
        "catches up, so a slow or absent learner stalls the clients instead of filling the disk.",
    )
    server_id: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=200,  # a learner takes ids of up to 256 characters; `--workers` adds "-w<i>"
        description="Name of this server towards the learner; its spool lives in spool_dir/server_id.",
    )
    torch_threads: int = Field(
        1, ge=1, description="Torch intra-op threads for the forward pass (1 avoids thread stalls on tiny batches)."
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="Torch device of the forward pass.")
    inference_thread: bool | None = Field(
        None,
        description="Run batches on a thread of their own, so the event loop keeps serving streams during a "
        "forward pass (a GPU, a large model); off, they run on the event loop and skip the thread hand-offs. "
        "Unset: on for cuda, off for cpu.",
    )
    seed: int | None = Field(
        None,
        description="Seed of this server's action sampling (and of a fresh model's weights, unless its spec has one).",
    )
    max_batch_size: int = Field(256, ge=1, description="Most env steps in one forward pass.")
    max_sessions: int = Field(1024, ge=1, description="Open sessions allowed; more get RESOURCE_EXHAUSTED.")
    max_envs_per_session: int = Field(1024, ge=1, description="Most sub-envs one session may declare.")
    max_fresh_space_size: int = Field(
        1 << 17,
        ge=1,
        description="Without a learner, checkpoint or --env: the largest observation or action space (values "
        "when flattened, Discrete one-hot) a client's hello may have a fresh model built for; larger ones get "
        "RESOURCE_EXHAUSTED. A model's first layers grow with it (at 131072, 32 MiB each with 64 units).",
    )
    max_message_bytes: int = Field(16 << 20, ge=1024, description="Largest gRPC message accepted or sent.")
    idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A session silent this long (or leaving an answer unread this long) is closed; its episodes "
        "ship as truncated.",
    )
    drain_timeout_s: float = Field(
        10.0,
        ge=0,
        description="On SIGTERM, how long open sessions may take to reach their episodes' end and be handed over "
        "(Actions.reconnect); those still open then end UNAVAILABLE, their episodes shipped as truncated.",
    )
    max_session_age_s: float = Field(
        0.0,
        ge=0,
        description="Hand a session over after this long (each session's age drawn within +-10%, so that "
        "sessions opened together leave apart): at its episodes' next end the client is told to reconnect "
        "(Actions.reconnect), through a Service name to any replica, so long-lived streams spread over replicas "
        "added or restarted later. No episode is cut. 0: never (sessions stay until the client or a stop ends them).",
    )
    tls_client_ca: FilePath | None = Field(None, description="PEM CA that client certificates must chain to (mTLS).")
    allow_non_finite_obs: bool = Field(
        False,
        description="Let +-inf observations pass where their Box bound is infinite (for envs in which infinity is "
        "a meaningful value). Off: every NaN or infinite observation is rejected (INVALID_ARGUMENT), as are "
        "non-finite rewards always, so that no such value reaches training; rejections are counted in "
        "rlgate_non_finite_rejected_total and /status.",
    )
