"""What the learner has done, against env steps: one row per update and one per finished episode.

The rows are kept for the live page (`/history/updates`, `/history/episodes`, paged) and each update's
row goes to the experiment log (TensorBoard and progress.csv) when there is one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlgate.learner.experiment_log import ExperimentLog
from rlgate.learner.history import Series

# Rows kept in memory for the live page (an update row is ~25 numbers, an episode row 3).
UPDATES_KEPT = 20_000
EPISODES_KEPT = 100_000


class Progress:
    """The update and episode histories, and the experiment log they feed (None: no log files)."""

    def __init__(self, log_dir: Path | None, env_steps: int = 0) -> None:
        self.updates = Series(UPDATES_KEPT)
        self.episodes = Series(EPISODES_KEPT)
        self.log = ExperimentLog(log_dir) if log_dir is not None else None
        self.started = time.monotonic()
        self._last = (self.started, env_steps)  # (time, env steps trained) at the previous update
        self.stale_steps_total = 0

    def episodes_finished(self, finished: Iterable[tuple[float, int]], env_steps: int) -> None:
        """Episodes (return, length) that reached the learner when it had received `env_steps` env steps."""
        for episode_return, length in finished:
            self.episodes.append({"env_steps": env_steps, "return": episode_return, "length": length})

    def update(
        self,
        stats: dict[str, Any],
        *,
        env_steps: int,
        version: int,
        seconds: float,
        episodes: int,
        returns: Iterable[float],
        lengths: Iterable[int],
    ) -> dict[str, Any]:
        """Record one update: its trainer `stats`, where training stands, and the recent episodes'
        returns and lengths (mean, min, max); returns the row."""
        now = time.monotonic()
        last_time, last_steps = self._last
        self._last = (now, env_steps)
        self.stale_steps_total += stats.get("stale_steps", 0)
        row: dict[str, Any] = {
            "env_steps": env_steps,
            "version": version,
            "time_s": now - self.started,
            "update_s": seconds,
            "env_steps_per_s": (env_steps - last_steps) / max(now - last_time, 1e-9),
            "episodes": episodes,
            **_summary("episode_return", list(returns)),
            **_summary("episode_length", list(lengths)),
            "train_steps": stats.get("env_steps"),
            "stale_steps_total": self.stale_steps_total,
        }
        row.update({key: value for key, value in stats.items() if key not in row and key != "env_steps"})
        self.updates.append(row)
        if self.log is not None:
            self.log.write(row)
        return row

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def _summary(name: str, values: list[float] | list[int]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_mean": None, f"{name}_min": None, f"{name}_max": None}
    return {f"{name}_mean": sum(values) / len(values), f"{name}_min": min(values), f"{name}_max": max(values)}
