"""ObservationPreprocessor: the base for a user's per-observation transform."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgate.connectors.batching import batch_items, is_batched
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.env_to_module.latest_observations import set_latest_observations
from rlgate.core.columns import Columns
from rlgate.core.tree import unbatch

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class ObservationPreprocessor(ConnectorV2, abc.ABC):
    """Replace each episode's latest observation by `preprocess(observation, episode)` (RLlib's
    SingleAgentObservationPreprocessor).

    The result is written back into the episode (so the learner trains on it) and, on the fast path,
    into the batched OBS. Override `recompute_output_observation_space` when the space changes, e.g.::

        class OneHot(ObservationPreprocessor):
            def recompute_output_observation_space(self, input_observation_space, input_action_space):
                return gym.spaces.Box(0.0, 1.0, (input_observation_space.n,), np.float32)

            def preprocess(self, observation, episode):
                return np.eye(self.input_observation_space.n, dtype=np.float32)[observation]
    """

    accepts_batched_obs = True

    @abc.abstractmethod
    def preprocess(self, observation: Any, episode: SingleAgentEpisode) -> Any:
        """The new observation for `observation`, the latest one of `episode`."""

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if not episodes:
            return batch
        observations = batch.get(Columns.OBS)
        if observations is not None and is_batched(observations):
            latest = unbatch(observations)
        else:
            latest = [episode.get_observations(-1) for episode in episodes]
        new = [self.preprocess(obs, episode) for obs, episode in zip(latest, episodes, strict=True)]
        set_latest_observations(batch, episodes, batch_items(new), self.observation_space)
        return batch
