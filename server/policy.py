"""The served policy: an RLModule between its env-to-module and module-to-env pipelines.

Everything here runs where the batcher runs its batches (its inference thread, or the event loop), one
call at a time, so a weight swap always falls between two batches, never inside one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors import ConnectorPipelineV2, ConnectorV2
from rlgate.connectors.batching import is_batched
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.models import RLModule, load_weights
from rlgate.server.default_pieces import acting_pieces
from rlgate.server.metrics import ServerMetrics
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.policy import build_policy
from rlgate.spec.run import RunSpec


class Policy:
    """Computes actions for a batch of episode rows with one forward pass."""

    def __init__(
        self,
        module: RLModule,
        *,
        spec: RunSpec,
        env_to_module: ConnectorPipelineV2,
        module_to_env: ConnectorPipelineV2,
        observation_space: gym.Space,
        action_space: gym.Space,
        metrics: ServerMetrics,
        version: int = 0,
    ) -> None:
        self.module = module
        self.spec = spec
        self.env_to_module = env_to_module
        self.module_to_env = module_to_env
        self.observation_space = observation_space
        self.action_space = action_space
        self.version = version
        self._metrics = metrics
        self._stage_seconds = metrics.stage_seconds
        self._pipelines: tuple[list[ConnectorV2], list[ConnectorV2]] = ([env_to_module], [module_to_env])
        self._acting: tuple[list[ConnectorV2], list[ConnectorV2]] | None = None
        self._acting_for: tuple[tuple[ConnectorV2, ...], tuple[ConnectorV2, ...]] | None = None  # the pieces then
        metrics.model_version.set(version)

    @classmethod
    def create(
        cls,
        spec: RunSpec,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        metrics: ServerMetrics,
        imports: ImportPolicy | None = None,
        weights: bytes | None = None,
        connector_state: dict[str, Any] | None = None,
        version: int = 0,
        device: str = "cpu",
        seed: int | None = None,
    ) -> Policy:
        """The spec's pipelines and module for these env spaces: fresh, or with these weights and state.

        A fresh model's weights follow the spec's seed; `seed` then seeds this server's action sampling.
        `imports`: where code the spec names may come from (default: rlgate's own pieces only).
        """
        built = build_policy(
            spec,
            observation_space,
            action_space,
            imports or ImportPolicy(),
            weights=weights,
            connector_state=connector_state,
            device=device,
        )
        if seed is not None:
            torch.manual_seed(seed)
        return cls(
            built.module,
            spec=spec,
            env_to_module=built.env_to_module,
            module_to_env=built.module_to_env,
            observation_space=observation_space,
            action_space=action_space,
            metrics=metrics,
            version=version,
        )

    def compute(self, obs: Any, episodes: Sequence[SingleAgentEpisode], explore: bool) -> dict[str, Any]:
        """Actions, actions_for_env and extra model outputs as numpy arrays, one row per episode.

        The stage counters take the CPU time, per stage, of the thread running the batch.
        """
        shared: dict[str, Any] = {}
        acting = self._acting_pieces()
        env_to_module, module_to_env = acting if acting and is_batched(obs) else self._pipelines
        module = self.module
        # One inference_mode for all three stages: torch ops in the pipelines (to tensors, sampling, logp)
        # then skip autograd's dispatch too, not only the forward's.
        with torch.inference_mode():
            t0 = time.thread_time()
            batch = {Columns.OBS: obs}
            for piece in env_to_module:
                batch = piece(rl_module=module, batch=batch, episodes=episodes, explore=explore, shared_data=shared)
            t1 = time.thread_time()
            outputs = module.forward_exploration(batch) if explore else module.forward_inference(batch)
            t2 = time.thread_time()
            for piece in module_to_env:
                outputs = piece(rl_module=module, batch=outputs, episodes=episodes, explore=explore, shared_data=shared)
            outputs[Columns.MODEL_VERSION] = np.full(len(episodes), self.version, dtype=np.int64)
            t3 = time.thread_time()
        self._count_stages(t0, t1, t2, t3)
        return outputs

    def _acting_pieces(self) -> tuple[list[ConnectorV2], list[ConnectorV2]] | None:
        """With the default pieces alone, those that act on batched observations (server.default_pieces); looked
        up again whenever the pipelines' pieces have changed since (an edit after this policy was built)."""
        pieces = (tuple(self.env_to_module.connectors), tuple(self.module_to_env.connectors))
        if pieces != self._acting_for:
            self._acting_for = pieces
            self._acting = acting_pieces(self.module, self.env_to_module, self.module_to_env)
        return self._acting

    def _count_stages(self, t0: float, t1: float, t2: float, t3: float) -> None:
        """Add one batch's stage times (thread CPU: env_to_module t0-t1, forward t1-t2, module_to_env t2-t3)."""
        stage_seconds = self._stage_seconds
        stage_seconds["env_to_module"] += t1 - t0
        stage_seconds["forward"] += t2 - t1
        stage_seconds["module_to_env"] += t3 - t2

    def set_weights(self, version: int, weights: bytes, connector_state: dict[str, Any] | None = None) -> None:
        """Swap to a newer model version and the learner's merged connector state (between batches)."""
        if version <= self.version:
            return
        load_weights(self.module, weights)
        if connector_state:
            self.env_to_module.set_state(connector_state)
        self.version = version
        self._metrics.model_version.set(version)

    def take_connector_delta(self) -> dict[str, Any]:
        """The connector statistics gathered since the last call, for the learner to merge (between batches).

        The pieces' own view keeps them (their global statistics absorb the delta), so normalisation
        does not jump; the learner's merged state replaces it with the next weights.
        """
        state = self.env_to_module.get_state()
        if state:
            self.env_to_module.set_state(self.env_to_module.merge_states([state]))
        return state
