"""PrevActionsPrevRewards: the last n actions and rewards added to each observation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.batching import batch_items
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.env_to_module.latest_observations import get_latest_observations, set_latest_observations
from rlgate.core.spaces import has_form_of

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class PrevActionsPrevRewards(ConnectorV2):
    """Turn each latest observation into a Dict: the original observation under `_orig_obs`, the last
    `n_prev_actions` actions (flattened, Discrete/MultiDiscrete one-hot) under `prev_n_actions` and the
    last `n_prev_rewards` rewards under `prev_n_rewards`, zero-filled before the episode's first step.

    Written back into the episodes (as RLlib does), so they must be in list mode; the fast path's batched
    OBS becomes the batched Dict. Needs both input spaces (the action space sizes `prev_n_actions`).

    Multi-agent (`multi_agent`, RLlib's option of the same name): the spaces are Dicts by agent id, and the
    latest observation of each agent that observed at the latest env step takes that agent's own previous
    actions (in its action space) and rewards, in its episode (`agent_ids` limits this to those agents;
    default: all). A latest observation the pipeline made already is left as it is: a terminated agent's last
    one repeated by its MultiAgentEpisode, or the latest one of a chunk cut while its step waited for actions (a
    server's flush runs the pipeline, then the successor's step runs it again); RLlib wraps those twice. It is
    told by its form: only an observation with the agent's input space's structure and shapes is augmented
    (this piece's Dict, or what later pieces made of it, e.g. FlattenObservations' flat array, has another).

    Deliberate differences from RLlib 2.60, whose data does not fit its own output space: there `prev_n_actions`
    of Discrete actions is [n, A] (its space says (n * A,)) and `prev_n_rewards` float64 once the episode has
    rewards; here both have their space's shape and dtype (float32). Box actions work here (RLlib's piece fails
    on them, reading the space's `n`).
    """

    accepts_batched_obs = True

    ORIG_OBS_KEY = "_orig_obs"
    PREV_ACTIONS_KEY = "prev_n_actions"
    PREV_REWARDS_KEY = "prev_n_rewards"

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        n_prev_actions: int = 1,
        n_prev_rewards: int = 1,
        multi_agent: bool = False,
        agent_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.n_prev_actions = n_prev_actions
        self.n_prev_rewards = n_prev_rewards
        self.multi_agent = multi_agent
        self.agent_ids = agent_ids
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        if input_action_space is None:
            return input_observation_space
        if self.multi_agent:
            assert isinstance(input_observation_space, gym.spaces.Dict)  # multi-agent: {agent id: space}
            assert isinstance(input_action_space, gym.spaces.Dict)
            return gym.spaces.Dict(
                {
                    agent_id: self._augmented_space(space, input_action_space[agent_id])
                    if self._augments(agent_id)
                    else space
                    for agent_id, space in input_observation_space.spaces.items()
                }
            )
        return self._augmented_space(input_observation_space, input_action_space)

    def _augments(self, agent_id: str) -> bool:
        return self.agent_ids is None or agent_id in self.agent_ids

    def _augmented_space(self, observation_space: gym.Space, action_space: gym.Space) -> gym.spaces.Dict:
        spaces = {self.ORIG_OBS_KEY: observation_space}
        if self.n_prev_actions:
            if isinstance(action_space, gym.spaces.MultiDiscrete):  # one-hot per sub-action
                size, low, high = int(np.sum(action_space.nvec)), 0.0, 1.0
            elif isinstance(action_space, gym.spaces.Discrete):
                size, low, high = int(action_space.n), 0.0, 1.0
            else:
                assert action_space.shape is not None  # a Box or MultiBinary action space
                size, low, high = int(np.prod(action_space.shape)), -np.inf, np.inf
            spaces[self.PREV_ACTIONS_KEY] = gym.spaces.Box(low, high, (self.n_prev_actions * size,), np.float32)
        if self.n_prev_rewards:
            spaces[self.PREV_REWARDS_KEY] = gym.spaces.Box(-np.inf, np.inf, (self.n_prev_rewards,), np.float32)
        return gym.spaces.Dict(spaces)

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
        if self.multi_agent:
            assert isinstance(self.input_observation_space, gym.spaces.Dict)  # multi-agent: {agent id: space}
            for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=True):
                space = self.input_observation_space[episode.agent_id]
                if self._augments(episode.agent_id) and has_form_of(space, episode.get_observations(-1)):
                    self._augment_agent(episode)
            return batch
        if not episodes:
            return batch
        augmented = {self.ORIG_OBS_KEY: get_latest_observations(batch, episodes)}
        augmented.update((key, batch_items(rows)) for key, rows in self._previous(episodes).items())
        set_latest_observations(batch, episodes, augmented, self.observation_space)
        return batch

    def _augment_agent(self, episode: SingleAgentEpisode) -> None:
        """An agent's latest observation, augmented in its episode (its own actions and rewards)."""
        augmented = {self.ORIG_OBS_KEY: episode.get_observations(-1)}
        augmented.update((key, rows[0]) for key, rows in self._previous([episode]).items())
        episode.set_observations(new_data=augmented, at_indices=-1)
        assert isinstance(self.observation_space, gym.spaces.Dict)  # multi-agent: {agent id: space}
        episode.observation_space = self.observation_space[episode.agent_id]

    def _previous(self, episodes: Sequence[SingleAgentEpisode]) -> dict[str, list[np.ndarray]]:
        """The added keys, each with one row per episode: its previous actions and rewards (where asked for)."""
        previous = {}
        if self.n_prev_actions:
            previous[self.PREV_ACTIONS_KEY] = [self._prev_actions(e) for e in episodes]
        if self.n_prev_rewards:
            previous[self.PREV_REWARDS_KEY] = [self._prev_rewards(e) for e in episodes]
        return previous

    def _prev_actions(self, episode: SingleAgentEpisode) -> np.ndarray:
        actions = episode.get_actions(slice(-self.n_prev_actions, None), fill=0.0, one_hot_discrete=True)
        return np.asarray(actions, np.float32).reshape(-1)

    def _prev_rewards(self, episode: SingleAgentEpisode) -> np.ndarray:
        return np.asarray(episode.get_rewards(slice(-self.n_prev_rewards, None), fill=0.0), np.float32)
