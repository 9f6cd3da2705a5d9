"""The served multi-agent policy: a MultiRLModule between its multi-agent env-to-module and module-to-env pipelines.

One call computes actions for every acting agent of a batch of MultiAgentEpisodes (many sessions' sub-envs):
the env-to-module pipeline groups the agents' observations by module, each module runs one forward pass,
and module-to-env hands back one {agent id: value} dict per episode. Each agent step records its module's
version (MODEL_VERSION), so the learner checks staleness per module.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import torch

from rlgate.connectors import ConnectorPipelineV2
from rlgate.core.columns import Columns
from rlgate.episodes import MultiAgentEpisode
from rlgate.episodes.multi_agent_episode import MappingFn
from rlgate.models import MultiRLModule, load_weights
from rlgate.server.metrics import ServerMetrics
from rlgate.server.policy import Policy
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.multi_agent import AgentSpaces, build_multi_agent_policy
from rlgate.spec.run import RunSpec


class MultiAgentPolicy(Policy):
    """Computes actions for the acting agents of a batch of multi-agent episodes, one forward per module.

    A Policy whose spaces are Dicts by agent id, whose `compute` takes MultiAgentEpisodes and whose weights
    come per module; the connector statistics and the stage metrics are Policy's.
    """

    multi_agent = True

    def __init__(
        self,
        module: MultiRLModule,
        *,
        spec: RunSpec,
        agent_spaces: AgentSpaces,
        mapping_fn: MappingFn,
        env_to_module: ConnectorPipelineV2,
        module_to_env: ConnectorPipelineV2,
        metrics: ServerMetrics,
        version: int = 0,
        module_versions: dict[str, int] | None = None,
    ) -> None:
        super().__init__(
            module,
            spec=spec,
            env_to_module=env_to_module,
            module_to_env=module_to_env,
            observation_space=gym.spaces.Dict({a: s[0] for a, s in agent_spaces.items()}),
            action_space=gym.spaces.Dict({a: s[1] for a, s in agent_spaces.items()}),
            metrics=metrics,
            version=version,
        )
        self.agent_spaces = agent_spaces
        self.mapping_fn = mapping_fn
        self.module_versions = {m: (module_versions or {}).get(m, 0) for m in module}

    @classmethod
    def create(
        cls,
        spec: RunSpec,
        agent_spaces: AgentSpaces,
        *,
        metrics: ServerMetrics,
        imports: ImportPolicy | None = None,
        module_weights: dict[str, bytes] | None = None,
        module_versions: dict[str, int] | None = None,
        connector_state: dict[str, Any] | None = None,
        version: int = 0,
        device: str = "cpu",
        seed: int | None = None,
    ) -> MultiAgentPolicy:
        """The spec's pipelines and modules for these agents' spaces: fresh, or with these module weights."""
        built = build_multi_agent_policy(
            spec,
            agent_spaces,
            imports or ImportPolicy(),
            module_weights=module_weights,
            connector_state=connector_state,
            device=device,
        )
        if seed is not None:
            torch.manual_seed(seed)
        return cls(
            built.module,
            spec=spec,
            agent_spaces=agent_spaces,
            mapping_fn=built.mapping_fn,
            env_to_module=built.env_to_module,
            module_to_env=built.module_to_env,
            metrics=metrics,
            version=version,
            module_versions=module_versions,
        )

    def compute(self, episodes: list[MultiAgentEpisode], explore: bool) -> dict[str, list[dict[str, Any]]]:
        """Per column (ACTIONS, ACTIONS_FOR_ENV, extra model outputs, MODEL_VERSION), one {agent: value} dict
        per episode, for the agents that are to act."""
        shared: dict[str, Any] = {}
        t0 = time.thread_time()
        batch = self.env_to_module(
            rl_module=self.module, batch={}, episodes=episodes, explore=explore, shared_data=shared
        )
        t1 = time.thread_time()
        if not batch:  # no agent acts in these episodes (they all just ended)
            to_env = {Columns.ACTIONS: [{} for _ in episodes], Columns.ACTIONS_FOR_ENV: [{} for _ in episodes]}
            t2 = time.thread_time()
        else:
            with torch.inference_mode():
                forward = self.module.forward_exploration if explore else self.module.forward_inference
                outputs = forward(batch)
            t2 = time.thread_time()
            to_env = self.module_to_env(
                rl_module=self.module, batch=outputs, episodes=episodes, explore=explore, shared_data=shared
            )
        to_env[Columns.MODEL_VERSION] = [
            {agent: self.module_versions[episode.module_for(agent)] for agent in actions}
            for episode, actions in zip(episodes, to_env[Columns.ACTIONS], strict=True)
        ]
        t3 = time.thread_time()
        self._count_stages(t0, t1, t2, t3)
        return to_env

    def write_back(self, episodes: list[MultiAgentEpisode]) -> None:
        """Run the env-to-module pipeline over `episodes` for its observation write-backs only (no forward)."""
        if episodes:
            self.env_to_module(rl_module=self.module, batch={}, episodes=episodes, explore=False, shared_data={})

    def set_weights(
        self,
        version: int,
        module_weights: dict[str, bytes],
        module_versions: dict[str, int],
        connector_state: dict[str, Any] | None = None,
    ) -> None:
        """Swap to a newer version: the modules whose weights came (between batches)."""
        if version <= self.version:
            return
        for module_id, weights in module_weights.items():
            load_weights(self.module[module_id], weights)
        self.module_versions.update({m: v for m, v in module_versions.items() if m in self.module_versions})
        if connector_state:
            self.env_to_module.set_state(connector_state)
        self.version = version
        self._metrics.model_version.set(version)
