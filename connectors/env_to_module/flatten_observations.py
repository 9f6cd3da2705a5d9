"""FlattenObservations: Dict/Tuple/Discrete/MultiDiscrete/MultiBinary observations as one flat float32 Box."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.batching import batch_items
from rlgate.connectors.connector_v2 import ConnectorV2, make_episode_keys_unique
from rlgate.connectors.env_to_module.latest_observations import get_latest_observations, set_latest_observations
from rlgate.core.columns import Columns
from rlgate.core.spaces import one_hot, space_struct
from rlgate.core.tree import flatten, map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class FlattenObservations(ConnectorV2):
    """Flatten the latest observations to [B, n] float32: leaves in space order, Discrete and MultiDiscrete
    parts one-hot, Box and MultiBinary parts flattened.

    Env-to-module: one vectorised pass over the batch (the fast path's batched, possibly nested OBS, or
    the observations gathered from the episodes); the flat observations are written back into the
    episodes (as RLlib does), which therefore must be in list mode (numpy-mode episodes keep their stored
    shapes).

    Learner (`as_learner_connector=True`, as RLlib's): adds each episode's observations but the final one,
    flattened, as OBS ([len(episode), n] per episode) and leaves the episodes alone, so the default
    AddObservationsFromEpisodesToBatch finds OBS and adds nothing. Deliberate differences from RLlib
    2.60, whose learner mode flattens only an episode's first observation (right for one-step episodes
    only: longer ones fail to reshape or come out with that observation's values spread over the rows)
    and fails on numpy'd Dict or Discrete episodes: every observation is flattened, in list or numpy
    mode; episode ids are first renamed as AddObservationsFromEpisodesToBatch renames them (RLlib's
    leaves them, mixing chunks of one episode), a no-op after PPO's AddOneTsToEpisodesAndTruncate; and
    a batch that already has OBS is refused (RLlib's appends a second set of observations to it).

    Multi-agent (`multi_agent`, RLlib's option of the same name; env-to-module): the spaces are Dicts by agent
    id and each agent's latest observation is flattened in its own space and written back into its episode
    (the agents that observed at the latest env step of each MultiAgentEpisode; AddObservationsFromEpisodesToBatch
    then adds them). `agent_ids` limits flattening to those agents (default: all).
    """

    accepts_batched_obs = True

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        multi_agent: bool = False,
        agent_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.multi_agent = multi_agent
        self.agent_ids = agent_ids
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        if self.multi_agent:
            assert isinstance(input_observation_space, gym.spaces.Dict)  # multi-agent: {agent id: space}
            return gym.spaces.Dict(
                {
                    agent_id: self._flat_space(space) if self._flattens(agent_id) else space
                    for agent_id, space in input_observation_space.spaces.items()
                }
            )
        return self._flat_space(input_observation_space)

    def _flattens(self, agent_id: str) -> bool:
        return self.agent_ids is None or agent_id in self.agent_ids

    @staticmethod
    def _flat_space(input_observation_space: gym.Space) -> gym.Space:
        sample = map_structure(lambda s: np.asarray(s.sample())[None], space_struct(input_observation_space))
        size = flatten_batch(sample, input_observation_space).shape[1]
        return gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

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
        if self._as_learner_connector:
            return self._add_flat_observations(batch, episodes)
        if self.multi_agent:
            assert isinstance(self.input_observation_space, gym.spaces.Dict)  # multi-agent: {agent id: space}
            assert isinstance(self.observation_space, gym.spaces.Dict)
            for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=True):
                if not self._flattens(episode.agent_id):
                    continue
                latest, flat_space = episode.get_observations(-1), self.observation_space[episode.agent_id]
                if isinstance(latest, np.ndarray) and latest.shape == flat_space.shape and latest.dtype == np.float32:
                    continue  # flat already: a terminated agent's repeated last observation
                space = self.input_observation_space[episode.agent_id]
                flat = flatten_batch(batch_items([latest]), space)[0]
                episode.set_observations(new_data=flat, at_indices=-1)
                episode.observation_space = flat_space
            return batch
        if episodes:
            assert self.input_observation_space is not None  # set by the pipeline before episodes come
            flat = flatten_batch(get_latest_observations(batch, episodes), self.input_observation_space)
            set_latest_observations(batch, episodes, flat, self.observation_space)
        return batch

    def _add_flat_observations(self, batch: dict[str, Any], episodes: Sequence[SingleAgentEpisode]) -> dict[str, Any]:
        if Columns.OBS in batch:
            raise ValueError(
                "FlattenObservations(as_learner_connector=True) adds OBS but the batch has it already: "
                "place it before the piece that adds OBS"
            )
        make_episode_keys_unique(episodes)
        assert self.input_observation_space is not None and self.observation_space is not None  # set by then
        for episode in episodes:
            n = len(episode)
            observations = episode.get_observations(slice(0, n))
            if n == 0:
                assert self.observation_space.shape is not None  # flat: a Box
                flat = np.zeros((0, *self.observation_space.shape), np.float32)
            else:
                if isinstance(observations, list):  # a list-mode episode
                    observations = batch_items(observations)
                flat = flatten_batch(observations, self.input_observation_space)
            self.add_n_batch_items(batch, Columns.OBS, flat, n, episode)
        return batch


def flatten_batch(observations: Any, space: gym.Space) -> np.ndarray:
    """A [B, ...] (nested) batch of `space` observations as [B, n] float32, discrete parts one-hot.

    ValueError for a space with nothing in it (an empty Dict or Tuple): no model can be built for it.
    """
    struct = space_struct(space)
    ordered = map_structure(lambda _, leaf: leaf, struct, observations)  # in the space's key order
    leaves = flatten(one_hot(ordered, struct))
    if not leaves:
        raise ValueError(f"the observation space {space} holds no values (an empty Dict or Tuple): nothing to flatten")
    rows = len(leaves[0])
    return np.concatenate([np.asarray(leaf, np.float32).reshape(rows, -1) for leaf in leaves], axis=1)
