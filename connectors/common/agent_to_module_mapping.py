"""AgentToModuleMapping: a multi-agent batch regrouped from (episode, agent, module) keys into per-module batches."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_agent
from rlgate.episodes.multi_agent_episode import MappingFn, MultiAgentEpisode, default_agent_to_module_mapping_fn

if TYPE_CHECKING:
    from rlgate.models import RLModule


class AgentToModuleMapping(ConnectorV2):
    """`{column: {(eps id, agent id, module id): [items]}}` -> `{module id: {column: [items]}}` (RLlib's piece).

    Items keep their order (episode, then agent, then the agent's items). In an env-to-module pipeline only
    agents that are to act (`episode.get_agents_to_act()`) are kept, and
    `shared_data["memorized_map_structure"]` records `{module id: [(eps id, agent id), ...]}` (one entry per
    row) for module-to-env's UnBatchToIndividualItems.

    Spaces: the input spaces are Dicts by agent id; the output spaces are Dicts by module id. rlgate's builders
    give `module_spaces` (module id -> (observation space, action space)). RLlib's arguments work too:
    `rl_module_specs` (module ids, or module id -> a spec with `observation_space` / `action_space`) and
    `agent_to_module_mapping_fn(agent_id, episode)`; each module gets its spec's space, else the agents' space
    when all agents share one, else the space of the agents the function maps to it (ValueError when those
    differ or no agent maps to it). Input spaces already keyed by exactly the module ids stay as they are.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        module_spaces: dict[str, tuple[gym.Space, gym.Space]] | None = None,
        rl_module_specs: Collection[str] | Mapping[str, Any] | None = None,
        agent_to_module_mapping_fn: MappingFn | None = None,
        as_learner_connector: bool = False,
        **kwargs: Any,
    ) -> None:
        self.module_spaces = dict(module_spaces or {})
        self.rl_module_specs = rl_module_specs
        self.agent_to_module_mapping_fn = agent_to_module_mapping_fn or default_agent_to_module_mapping_fn
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
        if self.module_spaces:
            return gym.spaces.Dict({module_id: spaces[which] for module_id, spaces in self.module_spaces.items()})
        if self.rl_module_specs is None:
            return space
        kind = ("observation", "action")[which]
        if not isinstance(space, gym.spaces.Dict):
            raise ValueError(f"AgentToModuleMapping: the input {kind} space must be a Dict by agent id, got {space}")
        if set(self.rl_module_specs) == set(space.spaces):
            return space
        return gym.spaces.Dict(
            {module_id: self._module_space(module_id, space, kind) for module_id in self.rl_module_specs}
        )

    def _module_space(self, module_id: str, by_agent: gym.spaces.Dict, kind: str) -> gym.Space:
        """RLlib's rule: the module's spec's space, else the agents' one shared space, else the space of the agents
        mapped to the module (asked with an empty episode)."""
        spec = self.rl_module_specs.get(module_id) if isinstance(self.rl_module_specs, Mapping) else None
        if getattr(spec, f"{kind}_space", None) is not None:
            return getattr(spec, f"{kind}_space")
        spaces = list(by_agent.spaces.values())
        if spaces and all(s == spaces[0] for s in spaces):
            return spaces[0]
        episode = MultiAgentEpisode()
        mapped = [
            agent_id for agent_id in by_agent.spaces if self.agent_to_module_mapping_fn(agent_id, episode) == module_id
        ]
        if not mapped:
            raise ValueError(
                f"AgentToModuleMapping: could not find or derive any {kind} space for RLModule {module_id!r}: no agent "
                f"of {list(by_agent.spaces)} maps to it; give its space in its rl_module_specs entry"
            )
        for agent_id in mapped[1:]:
            if by_agent[agent_id] != by_agent[mapped[0]]:
                raise ValueError(
                    f"AgentToModuleMapping: two agents ({mapped[0]!r} and {agent_id!r}) map to the same ModuleID "
                    f"{module_id!r} but have different {kind} spaces ({by_agent[mapped[0]]} and {by_agent[agent_id]})"
                )
        return by_agent[mapped[0]]

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[MultiAgentEpisode],
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
