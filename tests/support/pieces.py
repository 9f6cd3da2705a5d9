"""Connector pieces for tests, named in run specs by import path ("support.pieces:Name")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from rlgate.connectors import ConnectorV2


class WaitForFile(ConnectorV2):
    """A learner piece that holds every update until `path` exists (at most `timeout_s`): an update that is
    visibly in progress, for as long as a test needs."""

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        path: str = "",
        timeout_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while not self.path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return batch


class FailOnValue(ConnectorV2):
    """An env-to-module piece that raises when any observation in its batch holds `value`: a user's piece
    that some client's in-bounds data breaks."""

    def __init__(
        self, input_observation_space: Any = None, input_action_space: Any = None, *, value: float = 3.0, **kwargs: Any
    ) -> None:
        self.value = value
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def __call__(self, *, batch: dict[str, Any], episodes: list, **kwargs: Any) -> dict[str, Any]:
        for episode in self.single_agent_episode_iterator(episodes):
            if (np.asarray(episode.get_observations(-1)) == self.value).any():
                raise ValueError(f"observation value {self.value} is not for me")
        return batch


class FailOnMarkedEpisode(ConnectorV2):
    """A multi-agent env-to-module piece that raises when an episode's custom_data holds "fail": a user's piece
    that some client's data breaks."""

    multi_agent = True

    def __call__(self, *, batch: dict[str, Any], episodes: list, **kwargs: Any) -> dict[str, Any]:
        if any(episode.custom_data.get("fail") for episode in episodes):
            raise ValueError("this episode is not for me")
        return batch
