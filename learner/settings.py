"""Settings of the learner: environment variables `RLGATE_*`, overridden by `rlgate learn` flags.

What the run is (env, model, connector pieces, sampling, PPO's hyper-parameters) is the run spec:
`--config run.toml` and `--spec.<section>.<field>` flags (spec/settings.py).
"""

from pathlib import Path
from typing import Annotated

from pydantic import Field

from rlgate.service.settings import Directory, ServiceSettings
from rlgate.spec.settings import SpecSettings

COLLECTIVE_TIMEOUT_S = 300.0  # learner/data_parallel.py says why

#: The learner's torch device, as `rlgate learn --device` and `rlgate up --device` take it (learner/device.py).
LearnerDevice = Annotated[
    str,
    Field(
        pattern=r"^(cpu|auto|cuda(:[0-9]+)?)$",
        description="Torch device the learner trains on (the model, its optimizer state, the train batches and the "
        "losses): cpu, cuda, cuda:N, or auto (cuda where torch sees a GPU, else cpu). Data-parallel ranks on CUDA "
        "each take cuda:LOCAL_RANK (one GPU per rank) and talk over NCCL; on the CPU, over gloo. Weights, "
        "checkpoints and connector state leave the learner on the CPU either way.",
    ),
]


class LearnerSettings(SpecSettings, ServiceSettings):
    """Every knob of `rlgate learn`: `RLGATE_CHECKPOINT_EVERY=5` equals `--checkpoint-every 5`."""

    port: int = Field(50052, ge=0, le=65535, description="gRPC port of the LearnerService; 0 picks a free one.")
    http_port: int = Field(8001, ge=0, le=65535, description="HTTP port for / /healthz /readyz /status /metrics.")
    checkpoint_dir: Directory = Field(
        Path("checkpoints"), description="Where checkpoints are written and resumed from."
    )
    log_dir: Directory | None = Field(
        None,
        description="Experiment log: TensorBoard event files and progress.csv (one row per update, x axis env "
        "steps) go here; unset: checkpoint_dir/logs. `rlgate up` puts them in its run folder.",
    )
    checkpoint_every: int = Field(
        10,
        ge=1,
        description="Write a checkpoint every this many updates (and after the first update of each start, and at "
        "least every checkpoint_every_s).",
    )
    checkpoint_every_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="Write a checkpoint after an update when the last one is this many seconds old, however few "
        "updates came since (slow updates, or a learner killed early, lose little).",
    )
    resume: bool = Field(
        True,
        description="Start from the latest checkpoint in checkpoint_dir, if there is one; with --no-resume, a fresh "
        "model, and an earlier run's intake files are set aside unread.",
    )
    max_staleness: int = Field(
        4,
        ge=0,
        description="Steps chosen by a model more than this many versions old are dropped (and counted).",
    )
    num_learners: int = Field(
        1,
        ge=1,
        description="Data-parallel learner processes (RLlib's num_learners): rank 0 serves and splits each train batch "
        "among all of them; they all-reduce gradients, so they hold one model (PPO, single-agent). Under torchrun "
        "(WORLD_SIZE set) torchrun's ranks are the learners instead.",
    )
    rendezvous_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="How long the data-parallel learners wait for each other to form their group (exit 2 after).",
    )
    collective_timeout_s: float = Field(
        COLLECTIVE_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="How long a data-parallel learner waits in one collective (an all-reduce, rank 0's next update) "
        "before its group counts as broken: a rank that hangs, or dies unseen (NCCL), fails the others within it. "
        "Every rank takes the same value; idle, rank 0 sends a heartbeat every quarter of it.",
    )
    device: LearnerDevice = "cpu"
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="Torch intra-op threads for training; unset: torch's default, one per core. Set 1 where the "
        "learner shares its cores with servers and env clients (`rlgate up` does): threads waiting for a busy core "
        "stall every update.",
    )

    def experiment_log_dir(self) -> Path:
        """Where the TensorBoard event files and progress.csv go."""
        return self.log_dir if self.log_dir is not None else self.checkpoint_dir / "logs"
