"""ScaleRewards: a learner connector piece that scales every reward before advantages are computed."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlgate.connectors import ConnectorV2


class ScaleRewards(ConnectorV2):
    """Multiply the episodes' rewards by `factor` (placed first in the learner pipeline, so GAE sees them)."""

    def __init__(
        self, input_observation_space: Any = None, input_action_space: Any = None, *, factor: float = 1.0, **kwargs: Any
    ) -> None:
        self.factor = factor
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list, **kwargs: Any) -> dict[str, Any]:
        for episode in episodes:
            if len(episode):
                episode.set_rewards(new_data=np.asarray(episode.get_rewards()) * self.factor)
        return batch
