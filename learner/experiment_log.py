"""The experiment log: every update's numbers as TensorBoard scalars and as one row of `progress.csv`.

Both use env steps as the x axis (TensorBoard's step), so runs of different speeds and resumed runs line
up. `tensorboard --logdir runs/` compares every `rlgate up` run; `progress.csv` (one row per update, a
fixed header) is what rl-zoo users load with pandas. A resumed learner appends to both.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import Any

from tensorboard.summary import Writer

log = logging.getLogger(__name__)

# Every column of progress.csv, in order, with its TensorBoard tag (None: the x axis itself).
COLUMNS: dict[str, str | None] = {
    "env_steps": None,
    "version": "train/version",
    "time_s": "time/elapsed_s",
    "update_s": "time/update_s",
    "env_steps_per_s": "time/env_steps_per_s",
    "episodes": "episodes/count",
    "episode_return_mean": "episodes/return_mean",
    "episode_return_min": "episodes/return_min",
    "episode_return_max": "episodes/return_max",
    "episode_length_mean": "episodes/length_mean",
    "episode_length_min": "episodes/length_min",
    "episode_length_max": "episodes/length_max",
    "policy_loss": "loss/policy",
    "vf_loss": "loss/vf",
    "entropy": "loss/entropy",
    "kl": "train/kl",
    "clip_fraction": "train/clip_fraction",
    "explained_variance": "train/explained_variance",
    "lr": "train/lr",
    "clip_param": "train/clip_param",
    "entropy_coeff": "train/entropy_coeff",
    "qf_loss": "loss/qf",
    "qf_twin_loss": "loss/qf_twin",
    "alpha_loss": "loss/alpha",
    "qf_mean": "train/qf_mean",
    "qf_min": "train/qf_min",
    "qf_max": "train/qf_max",
    "td_error_mean": "train/td_error_mean",
    "alpha": "train/alpha",
    "epsilon": "train/epsilon",
    "actor_lr": "train/actor_lr",
    "critic_lr": "train/critic_lr",
    "alpha_lr": "train/alpha_lr",
    "updates": "train/updates",
    "updates_total": "train/updates_total",
    "buffer_size": "data/buffer_size",
    "replay_ratio": "data/replay_ratio",
    "train_steps": "data/train_steps",
    "staleness": "data/staleness",
    "stale_steps": "data/stale_steps",
    "stale_steps_total": "data/stale_steps_total",
    "steps_in_during_update": "data/steps_in_during_update",
    "scatter_s": "time/scatter_s",
    "allreduce_s": "time/allreduce_s",
    "check_s": "time/check_s",
    "gather_s": "time/gather_s",
}

# The columns only some algorithms' updates have (the others' rows leave them blank); the rest every update has.
ALGORITHM_COLUMNS: dict[str, tuple[str, ...]] = {
    "PPO": (
        "policy_loss", "vf_loss", "entropy", "kl", "clip_fraction", "explained_variance", "lr", "clip_param",
        "entropy_coeff",
    ),
    "DQN": (
        "qf_loss", "qf_mean", "qf_min", "qf_max", "td_error_mean", "lr", "epsilon", "updates", "updates_total",
        "buffer_size", "replay_ratio",
    ),
    "SAC": (
        "qf_loss", "qf_twin_loss", "policy_loss", "alpha_loss", "alpha", "entropy", "qf_mean", "qf_min", "qf_max",
        "td_error_mean", "actor_lr", "critic_lr", "alpha_lr", "updates", "updates_total", "buffer_size",
        "replay_ratio",
    ),
}  # fmt: skip

# The columns only data-parallel learners' updates have (--num-learners): seconds in the group's collectives.
DATA_PARALLEL_COLUMNS = ("scatter_s", "allreduce_s", "check_s", "gather_s")

PROGRESS = "progress.csv"


class ExperimentLog:
    """TensorBoard event files and progress.csv in `directory` (created if missing)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._writer = Writer(str(directory))
        path = directory / PROGRESS
        if path.exists() and path.stat().st_size and _header(path) != list(COLUMNS):
            aside = path.with_name(f"progress-{time.strftime('%Y%m%d-%H%M%S')}.csv")
            path.rename(aside)
            log.warning("%s has other columns than this rlgate writes: moved to %s", path, aside)
        # Open for the learner's lifetime (close() closes it).
        self._file = open(path, "a", newline="")  # noqa: SIM115
        self._csv = csv.DictWriter(self._file, fieldnames=list(COLUMNS), extrasaction="ignore")
        if self._file.tell() == 0:
            self._csv.writeheader()

    def write(self, row: dict[str, Any]) -> None:
        """One update: each known value as a scalar at step row["env_steps"], and a CSV row (blank: None)."""
        step = int(row["env_steps"])
        for key, tag in COLUMNS.items():
            value = row.get(key)
            if tag is not None and value is not None:
                self._writer.add_scalar(tag, value, step)
        self._writer.flush()
        self._csv.writerow({key: "" if row.get(key) is None else row[key] for key in COLUMNS})
        self._file.flush()

    def close(self) -> None:
        self._writer.close()
        self._file.close()


def _header(path: Path) -> list[str]:
    with open(path, newline="") as file:
        return next(csv.reader(file), [])
