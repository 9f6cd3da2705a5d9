"""AgentToModuleMapping: a multi-agent batch regrouped from (episode, agent, module) keys into per-module batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym

from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_agent

if TYPE_CHECKING:
    from rlgate.episodes import MultiAgentEpisode
    from rlgate.models import RLModule


class AgentToModuleMapping(ConnectorV2):
    """`{column: {(eps id, agent id, module id): [items]}}` -> `{module id: {column: [items]}}` (RLlib's piece).

    Items keep their order (episode, then agent, then the agent's items). In an env-to-module pipeline only
    agents that are to act (`episode.get_agents_to_act()`) are kept, and
    `shared_data["memorized_map_structure"]` records `{module id: [(eps id, agent id), ...]}` (one entry per
    row) for module-to-env's UnBatchToIndividualItems. Spaces: the input spaces are Dicts by agent id; the
    output spaces are Dicts by module id (`module_spaces`, or the space of the agents mapped to it).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        module_spaces: dict[str, tuple[gym.Space, gym.Space]] | None = None,
        as_learner_connector: bool = False,
        **kwargs: Any,
    ) -> None:
        self.module_spaces = dict(module_spaces or {})
        super().__init__(input_observation_space, input_action_space, as_learner_connector=as_learner_connector)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        return self._by_module(input_observation_space, 0)

    def recompute_output_action_space(
        self, input_observation_space: gym.Space | None, input_action_space: gym.Space
    ) -> gym.Space:
        return self._by_module(input_action_space, 1)

    def _by_module(self, space: gym.Space, which: int) -> gym.Space:
        if not self.module_spaces:
            return space
        return gym.spaces.Dict({module_id: spaces[which] for module_id, spaces in self.module_spaces.items()})

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: list[MultiAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if not is_multi_agent(episodes) and not self._as_learner_connector:
            return batch
        to_act = None
        if not self._as_learner_connector:
            to_act = {(episode.id_, agent_id) for episode in episodes for agent_id in episode.get_agents_to_act()}
        by_module: dict[str, dict[str, list]] = {}
        rows: dict[str, list[tuple]] = {}
        for position, (column, data) in enumerate(batch.items()):
            for (eps_id, agent_id, module_id), items in data.items():
                if to_act is not None and (eps_id, agent_id) not in to_act:
                    continue
                by_module.setdefault(module_id, {}).setdefault(column, []).extend(items)
                if position == 0:
                    rows.setdefault(module_id, []).extend([(eps_id, agent_id)] * len(items))
        if shared_data is not None and not self._as_learner_connector:
            shared_data["memorized_map_structure"] = rows
        return by_module
