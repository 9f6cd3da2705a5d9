"""The best checkpoint so far, by the learner's mean return when it was written: `<checkpoint dir>/best`.

A learner that runs for days keeps publishing new versions whatever they are worth; a policy that got worse
(PPO can collapse, and a schedule can freeze it there) must not take the good one with it. `best` is a
symbolic link to the checkpoint folder (`v000420`) whose mean return (of the last 20 episodes the env ended,
written into its metadata.json) is the highest so far, so `rlgate serve --checkpoint DIR/best`,
`rlgate eval --checkpoint DIR/best` and `Policy.load("DIR/best")` use it as they would any checkpoint. A mean
over fewer than a full window of episodes is no evidence: such a checkpoint is never the best. The episodes
behind a checkpoint's mean were played by the versions before it, so the first version to reach a mean is kept,
not a later one that equals it (a policy getting worse still shows the old mean for a while).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BEST = "best"


class BestCheckpoint:
    """The `best` link in a checkpoint directory, and the version and mean return it points at."""

    def __init__(self, directory: Path, *, resume: bool = True) -> None:
        """`resume`: take over the link a previous learner left; False (a fresh model): remove it (it named an
        earlier run's checkpoint; the folders themselves stay)."""
        self.link = directory / BEST
        self.version: int | None = None
        self.mean_return: float | None = None
        if not resume:
            self.link.unlink(missing_ok=True)
            return
        try:
            metadata = json.loads((self.link / "metadata.json").read_text())
            self.version, self.mean_return = int(metadata["version"]), float(metadata["mean_return"])
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or one this learner cannot read: a new one
            pass

    def offer(self, checkpoint: Path, version: int, mean_return: float | None) -> bool:
        """Point `best` at this checkpoint if its mean return (None: not a full window of episodes) is higher than
        the best one's; whether it did."""
        if mean_return is None or (self.mean_return is not None and mean_return <= self.mean_return):
            return False
        pending = self.link.with_name(f".{BEST}")
        pending.unlink(missing_ok=True)
        pending.symlink_to(checkpoint.name, target_is_directory=True)  # relative: the directory may move
        os.replace(pending, self.link)
        self.version, self.mean_return = version, mean_return
        log.info("best checkpoint now %s: mean return %.4g", checkpoint, mean_return)
        return True

    def status(self) -> dict[str, Any] | None:
        """For /status: where the best checkpoint is, its version and mean return (None before there is one)."""
        if self.version is None:
            return None
        return {"path": str(self.link), "version": self.version, "mean_return": self.mean_return}
