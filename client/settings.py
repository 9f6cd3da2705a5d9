"""Settings of the env clients: environment variables `RLGATE_*`, overridden by `rlgate env` flags."""

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import ByteSize, Field, FilePath

from rlgate.service.settings import Backend, BackendSettings, Directory, ImportSettings
from rlgate.spec.settings import SpecSettings


class ClientSettings(SpecSettings, ImportSettings, BackendSettings):
    """Every knob of `rlgate env`; `RLGATE_SERVER=host:50051` and `--server host:50051` set the same field.

    The env comes from the run spec's env section (--config run.toml, or --env and --envs-per-client).
    """

    SHORTHANDS: ClassVar[dict[str, tuple[str, ...]]] = {
        **SpecSettings.SHORTHANDS,
        "envs_per_client": ("env", "num_envs"),
    }

    server: str = Field(
        "127.0.0.1:50051",
        description="Inference server as host:port, or a gRPC target (dns:///name:port balances replicas).",
    )
    num_clients: int = Field(1, ge=1, description="Client processes, each with its own stream.")
    envs_per_client: int | None = Field(
        None, ge=1, description="Shorthand for --spec.env.num-envs: sub-envs per client (>1: a vector env)."
    )
    max_steps: int = Field(0, ge=0, description="Env steps each client runs before it stops (0: until Ctrl-C).")
    explore: bool = Field(True, description="Ask for sampled actions (training) rather than greedy ones.")
    connect_timeout_s: float = Field(
        30.0,
        ge=0,
        description="How long a client waits to connect to the server (at start, and again after a broken "
        "stream) before it gives up and `rlgate env` exits with an error; 0: wait forever.",
    )
    tls_ca: FilePath | None = Field(None, description="PEM CA to verify the server by; set to connect over TLS.")
    progress: bool = Field(True, description="Show a progress bar with steps/s and mean return.")
    inference: Literal["server", "local"] = Field(
        "server",
        description="Where the policy acts: on the server (each step a round trip), or here in each client with the "
        "weights the server relays (single-agent runs), which sends the server its episodes; faster with few envs "
        "per client. Code the server's run spec names is imported only from --allow-import's modules.",
    )
    spool_dir: Directory = Field(
        Path("spool"),
        description="Local inference: episodes waiting for the server's ack are kept in spool_dir/<client id> "
        "(client id: <env id>-<index>), so a crash loses none: the next start with the same ids sends them.",
    )
    max_spool: ByteSize = Field(
        ByteSize(1 << 30),
        description="Local inference: most bytes a client's spool may hold; when full, the client pauses until the "
        "server takes its episodes.",
    )
    drain_timeout_s: float = Field(
        10.0, ge=0, description="Local inference: on stop, how long each client waits for the server to take its spool."
    )
    torch_threads: int = Field(1, ge=1, description="Local inference: torch intra-op threads of each client.")
    backend: Backend = Field(
        "torch",
        description="Local inference: what runs each client's forward pass, as a server's --backend (auto: "
        "onnxruntime for the default model where it exports, torch otherwise). torch by default: at one env per "
        "client neither was reliably faster while a learner trains (onnxruntime's cheaper forward pass is spent "
        "rebuilding its sessions for every weights version; BENCHMARKS.md, B8).",
    )
