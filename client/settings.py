"""Settings of the env clients: environment variables `RLGATE_*`, overridden by `rlgate env` flags."""

from pathlib import Path

from pydantic import Field

from rlgate.service.settings import RlgateSettings


class ClientSettings(RlgateSettings):
    """Every knob of `rlgate env`; `RLGATE_SERVER=host:50051` and `--server host:50051` set the same field."""

    server: str = Field(
        "127.0.0.1:50051",
        description="Inference server as host:port, or a gRPC target (dns:///name:port balances replicas).",
    )
    env: str = Field("CartPole-v1", description="Gymnasium env id to run.")
    num_clients: int = Field(1, ge=1, description="Client processes, each with its own stream.")
    envs_per_client: int = Field(1, ge=1, description="Sub-envs per client (>1: a vector env, one message for all).")
    max_steps: int = Field(0, ge=0, description="Env steps each client runs before it stops (0: until Ctrl-C).")
    seed: int | None = Field(None, description="Seed of the first sub-env; the others count up from it.")
    explore: bool = Field(True, description="Ask for sampled actions (training) rather than greedy ones.")
    tls_ca: Path | None = Field(None, description="PEM CA to verify the server by; set to connect over TLS.")
    progress: bool = Field(True, description="Show a progress bar with steps/s and mean return.")
