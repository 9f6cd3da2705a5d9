"""Settings of the learner: environment variables `RLGATE_*`, overridden by `rlgate learn` flags.

The PPO hyper-parameters are `PPOConfig`'s fields (declared and documented in learner/ppo.py).
"""

from pathlib import Path

from pydantic import Field

from rlgate.learner.ppo import PPOConfig
from rlgate.service.settings import ServiceSettings


class LearnerSettings(PPOConfig, ServiceSettings):
    """Every knob of `rlgate learn`: `RLGATE_TRAIN_BATCH_SIZE=512` equals `--train-batch-size 512`."""

    port: int = Field(50052, ge=0, le=65535, description="gRPC port of the LearnerService; 0 picks a free one.")
    http_port: int = Field(8001, ge=0, le=65535, description="HTTP port for / /healthz /readyz /status /metrics.")
    env: str | None = Field(
        None,
        description="Gymnasium env id whose spaces a fresh model is built for; may stay unset when checkpoint_dir "
        "holds a checkpoint to resume.",
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
    max_staleness: int = Field(
        4,
        ge=0,
        description="Steps chosen by a model more than this many versions old are dropped (and counted).",
    )

    def ppo(self) -> PPOConfig:
        """The PPO hyper-parameters among these settings."""
        return PPOConfig(**self.model_dump(include=set(PPOConfig.model_fields)))
