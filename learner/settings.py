"""Settings of the learner: environment variables `RLGATE_*`, overridden by `rlgate learn` flags.

The PPO defaults are rl-zoo's CartPole-v1 hyper-parameters (gamma 0.98, lambda 0.8, 20 epochs,
lr 1e-3), which learn in tens of thousands of env steps; every one is documented below.
"""

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class LearnerSettings(BaseSettings):
    """Every knob of `rlgate learn`: `RLGATE_TRAIN_BATCH_SIZE=512` equals `--train-batch-size 512`."""

    model_config = SettingsConfigDict(env_prefix="RLGATE_", cli_kebab_case=True, cli_implicit_flags=True)

    host: str = Field("127.0.0.1", description="Address the gRPC and HTTP servers bind to (0.0.0.0 in containers).")
    port: int = Field(50052, ge=0, le=65535, description="gRPC port of the LearnerService; 0 picks a free one.")
    http_port: int = Field(8001, ge=0, le=65535, description="HTTP port for / /healthz /readyz /status /metrics.")
    env: str | None = Field(
        None, description="Gymnasium env id whose spaces the model is built for; unset: the first episodes'."
    )
    checkpoint_dir: Path = Field(Path("checkpoints"), description="Where checkpoints are written and resumed from.")
    checkpoint_every: int = Field(10, ge=1, description="Write a checkpoint every this many updates.")
    resume: bool = Field(
        True,
        description="Start from the latest checkpoint in checkpoint_dir, if there is one; with --no-resume, a fresh "
        "model, and an earlier run's intake files are set aside unread.",
    )
    seed: int | None = Field(None, description="Seed for the initial weights and minibatch shuffling.")
    fcnet_hiddens: list[int] = Field([64, 64], description="Hidden layer sizes of the policy and value MLPs.")
    mean_std_filter: bool = Field(
        False,
        description="Normalise observations with a MeanStdFilter; the learner merges its statistics across "
        "servers and sends them back with the weights (server and learner must agree).",
    )
    train_batch_size: int = Field(512, ge=1, description="Env steps per PPO update.")
    minibatch_size: int = Field(128, ge=1, description="Env steps per SGD minibatch.")
    num_epochs: int = Field(20, ge=1, description="Passes of SGD over each train batch.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    gamma: float = Field(0.98, gt=0, le=1, description="Discount factor.")
    lambda_: float = Field(0.8, ge=0, le=1, description="GAE lambda: bias/variance trade-off of advantages.")
    clip_param: float = Field(0.2, gt=0, description="PPO clip range of the probability ratio.")
    vf_clip_param: float = Field(10.0, gt=0, description="Clip range of the value loss (in reward units).")
    vf_loss_coeff: float = Field(0.5, ge=0, description="Weight of the value loss.")
    entropy_coeff: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    grad_clip: float = Field(0.5, gt=0, description="Max global gradient norm.")
    max_staleness: int = Field(
        4,
        ge=0,
        description="Steps chosen by a model more than this many versions old are dropped (and counted).",
    )
    token: SecretStr | None = Field(None, description="Bearer token every gRPC call must carry (unset: none).")
    tls_cert: Path | None = Field(None, description="PEM certificate chain; with tls_key, gRPC is served over TLS.")
    tls_key: Path | None = Field(None, description="PEM private key for tls_cert.")
