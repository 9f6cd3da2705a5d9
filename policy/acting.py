"""ActingCore: the one code path that turns observations into actions.

env-to-module -> the module's forward (sampling or greedy) -> module-to-env, once for a batch of episodes, in a
single- or a multi-agent run. Everything that acts goes through it: the inference server (one batch of many
sessions' sub-envs), `rlgate.Policy` and `rlgate.MultiAgentPolicy` (and so `rlgate eval`). What differs lives
around it: the server's batching, sessions and metrics; a Policy's per-env episodes.

Single-agent callers that hold the episodes' latest observations as one [B, ...] batch (a step message, a vector
env) pass it as `observations`; the pipelines then start from it where their pieces allow (`fast_path`).
Otherwise, and always in multi-agent runs, the env-to-module pipeline starts from an empty batch and gathers the
observations from the episodes, as RLlib's EnvRunner does.

Everything here runs one call at a time on one thread (the server's batches run so): a weight swap
(`set_weights`) falls between two batches, never inside one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, get_args

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors import ConnectorPipelineV2
from rlgate.core.columns import Columns
from rlgate.core.errors import UserError
from rlgate.episodes.multi_agent_episode import MappingFn
from rlgate.models import RLModule, load_weights
from rlgate.models.actor_critic import ActorCriticModule
from rlgate.policy.fast_path import Pieces, batched_pieces
from rlgate.service.settings import Backend
from rlgate.spec.build import build_policy
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import AgentSpaces, agent_spaces_of, build_multi_agent_policy
from rlgate.spec.run import RunSpec

if TYPE_CHECKING:
    from rlgate.export.serving import OnnxForward

log = logging.getLogger(__name__)

#: The stages `act` times (CPU seconds of the acting thread), in order.
STAGES = ("env_to_module", "forward", "module_to_env")
#: The columns of a multi-agent batch in which no agent acts.
NO_ACTIONS = (Columns.ACTIONS, Columns.ACTIONS_FOR_ENV)
#: What runs the module's forward pass: torch, or (single-agent, CPU) onnxruntime with the exported module;
#: "auto": onnxruntime for the default model of a single-agent run on the CPU (it costs less CPU at every batch
#: size measured: BENCHMARKS.md, "ONNX Runtime backend"), torch for everything else (a module of the user's keeps
#: its own Python forward, and so does a module that does not export, or an install without onnxruntime).
BACKENDS = get_args(Backend)


class ActingCore:
    """A run spec's pipelines and module (a MultiRLModule in multi-agent runs), acting for batches of episodes.

    `observation_space` and `action_space` are the env's (Dicts by agent id in multi-agent runs); `version` the
    model version acting (multi-agent: the newest of any module; `module_versions` per module); `stage_seconds`
    a dict that each batch adds its CPU seconds per stage (STAGES) to: the server exports it as a metric.
    """

    def __init__(
        self,
        spec: RunSpec,
        env_to_module: ConnectorPipelineV2,
        module: RLModule,
        module_to_env: ConnectorPipelineV2,
        *,
        observation_space: gym.Space,
        action_space: gym.Space,
        mapping_fn: MappingFn | None = None,
        version: int = 0,
        module_versions: dict[str, int] | None = None,
        stage_seconds: dict[str, float] | None = None,
    ) -> None:
        self.spec = spec
        self.env_to_module = env_to_module
        self.module = module
        self.module_to_env = module_to_env
        self.observation_space = observation_space
        self.action_space = action_space
        self.multi_agent = spec.multi_agent is not None
        self.mapping_fn = mapping_fn
        self.agent_spaces: AgentSpaces = agent_spaces_of(observation_space, action_space) if self.multi_agent else {}
        self.version = version
        self.module_versions = {m: (module_versions or {}).get(m, 0) for m in module} if self.multi_agent else {}
        self.stage_seconds = stage_seconds if stage_seconds is not None else dict.fromkeys(STAGES, 0.0)
        self._whole: Pieces = ([env_to_module], [module_to_env])
        self._batched: Pieces | None = None
        self._batched_for: tuple | None = None  # the pipelines' pieces `_batched` was chosen for
        self.onnx: OnnxForward | None = None  # the onnxruntime backend (`use_onnxruntime`)

    def use_onnxruntime(self) -> None:
        """Run the forward pass (and GetActions' sampling) in onnxruntime, with the module and its action selection
        exported as one graph (export.serving), on torch's number of threads; the pipelines' pieces stay as they
        are. Single-agent runs on the CPU (SpecError otherwise, or where the module cannot be exported)."""
        if self.multi_agent:
            raise SpecError("--backend onnxruntime serves single-agent runs: use --backend torch")
        if any(parameter.device.type != "cpu" for parameter in self.module.parameters()):
            raise SpecError("--backend onnxruntime runs on the CPU: use --device cpu")
        try:
            from rlgate.export.serving import OnnxForward  # onnx and onnxruntime load only for this backend

            self.onnx = OnnxForward(self.module, self.action_space, torch.get_num_threads())
        except ImportError as exc:  # an install without them
            raise SpecError(f"--backend onnxruntime: {exc}: install onnx and onnxruntime") from None
        except UserError as exc:
            raise SpecError(f"--backend onnxruntime: {exc}") from None
        log.info("forward pass in onnxruntime (the module exported to ONNX; --backend torch to keep torch)")

    @classmethod
    def build(
        cls,
        spec: RunSpec,
        observation_space: gym.Space,
        action_space: gym.Space,
        imports: ImportPolicy | None = None,
        *,
        weights: bytes | dict[str, bytes] | None = None,
        module_versions: dict[str, int] | None = None,
        connector_state: dict[str, Any] | None = None,
        version: int = 0,
        device: str = "cpu",
        seed: int | None = None,
        stage_seconds: dict[str, float] | None = None,
        backend: Backend = "torch",
    ) -> ActingCore:
        """The spec's policy for the env's spaces (Dicts by agent id in a multi-agent run): fresh, or with these
        weights (one set per module id in a multi-agent run) and connector state (MeanStdFilter's statistics).

        A fresh model's weights follow the spec's seed; `seed` then seeds torch's generator, which samples the
        actions of exploring batches. `imports`: where code the spec names may come from (default: rlgate's own).
        `backend`: one of BACKENDS (see `use_onnxruntime`).
        """
        imports = imports or ImportPolicy()
        mapping_fn = None
        if spec.multi_agent is not None:
            if isinstance(weights, bytes):
                raise SpecError("a multi-agent run takes one set of weights per module id, not one set")
            agent_spaces = agent_spaces_of(observation_space, action_space)
            built_ma = build_multi_agent_policy(
                spec, agent_spaces, imports, module_weights=weights, connector_state=connector_state, device=device
            )
            env_to_module, module, module_to_env = built_ma.env_to_module, built_ma.module, built_ma.module_to_env
            mapping_fn = built_ma.mapping_fn
        else:
            if isinstance(weights, dict):
                raise SpecError("a single-agent run takes one set of weights, not one per module id")
            built = build_policy(
                spec,
                observation_space,
                action_space,
                imports,
                weights=weights,
                connector_state=connector_state,
                device=device,
            )
            env_to_module, module, module_to_env = built.env_to_module, built.module, built.module_to_env
        if seed is not None:
            torch.manual_seed(seed)
        core = cls(
            spec,
            env_to_module,
            module,
            module_to_env,
            observation_space=observation_space,
            action_space=action_space,
            mapping_fn=mapping_fn,
            version=version,
            module_versions=module_versions,
            stage_seconds=stage_seconds,
        )
        if backend == "auto":
            default_model = type(core.module) is ActorCriticModule and device == "cpu"
            if default_model and not core.multi_agent:
                try:
                    core.use_onnxruntime()
                except SpecError as exc:  # not installed, or the module does not export: torch acts
                    log.warning("forward pass in torch: %s", exc)
        elif backend == "onnxruntime":
            core.use_onnxruntime()
        return core

    def act(self, episodes: Sequence[Any], explore: bool, observations: Any = None) -> dict[str, Any]:
        """Actions for the latest step of each episode: sampled (`explore`) or the module's greedy ones.

        Single-agent: `observations` are the episodes' latest ones as one [B, ...] batch, if the caller has them
        so; the result is per column ([B, ...] numpy arrays, row i for episodes[i]): ACTIONS (for the episode),
        ACTIONS_FOR_ENV (for env.step), the module's other outputs and MODEL_VERSION.
        Multi-agent (MultiAgentEpisodes): per column one {agent id: value} dict per episode, for the agents
        that act now (none in an episode that just ended); MODEL_VERSION is each agent's module's version.
        """
        module = self.module
        shared: dict[str, Any] = {}
        batch, (env_to_module, module_to_env) = self._start(observations)
        # One inference_mode for all three stages: torch ops in the pipelines (to tensors, sampling, logp)
        # then skip autograd's dispatch too, not only the forward's.
        with torch.inference_mode():
            t0 = time.thread_time()
            for piece in env_to_module:
                batch = piece(rl_module=module, batch=batch, episodes=episodes, explore=explore, shared_data=shared)
            t1 = time.thread_time()
            if not batch:  # multi-agent: no agent acts in these episodes (they all just ended)
                outputs: dict[str, Any] = {column: [{} for _ in episodes] for column in NO_ACTIONS}
                t2 = time.thread_time()
            else:
                if self.onnx is not None:
                    outputs = self.onnx.forward(batch, explore)
                else:
                    outputs = module.forward_exploration(batch) if explore else module.forward_inference(batch)
                t2 = time.thread_time()
                for piece in module_to_env:
                    outputs = piece(
                        rl_module=module, batch=outputs, episodes=episodes, explore=explore, shared_data=shared
                    )
            outputs[Columns.MODEL_VERSION] = self._versions(episodes, outputs)
            t3 = time.thread_time()
        stages = self.stage_seconds
        stages["env_to_module"] += t1 - t0
        stages["forward"] += t2 - t1
        stages["module_to_env"] += t3 - t2
        return outputs

    def _start(self, observations: Any) -> tuple[dict[str, Any], Pieces]:
        """The batch env-to-module starts from, and the pieces that run (see `fast_path`)."""
        if observations is None or self.multi_agent:
            return {}, self._whole
        pieces = (tuple(self.env_to_module.connectors), tuple(self.module_to_env.connectors))
        if pieces != self._batched_for:  # chosen again whenever the pipelines were edited since
            self._batched_for = pieces
            self._batched = batched_pieces(self.module, self.env_to_module, self.module_to_env)
        if self._batched is None:
            return {}, self._whole
        return {Columns.OBS: observations}, self._batched

    def _versions(self, episodes: Sequence[Any], outputs: dict[str, Any]) -> Any:
        """The MODEL_VERSION column: this version per row, or per acting agent its module's version."""
        if not self.multi_agent:
            return np.full(len(episodes), self.version, dtype=np.int64)
        return [
            {agent: self.module_versions[episode.module_for(agent)] for agent in actions}
            for episode, actions in zip(episodes, outputs[Columns.ACTIONS], strict=True)
        ]

    def write_back(self, episodes: list[Any]) -> None:
        """Run the env-to-module pipeline over multi-agent episodes for its observation write-backs only (no
        forward): the final observations of episodes that ended, before they ship."""
        if episodes:
            self.env_to_module(rl_module=self.module, batch={}, episodes=episodes, explore=False, shared_data={})

    def set_weights(
        self,
        version: int,
        weights: bytes | dict[str, bytes],
        *,
        connector_state: dict[str, Any] | None = None,
        module_versions: dict[str, int] | None = None,
    ) -> Future | None:
        """Swap to a newer version (call between batches): its weights (multi-agent: of the modules that changed,
        with their `module_versions`) and the learner's merged connector state. An older version is ignored.

        With onnxruntime, the new sessions are built on a worker thread while the old ones go on acting: the future
        returned is done when they are, and `take_rebound()` (between batches) then acts with them, as `version`.
        The connector state applies at once (what a batch records is what acted, either way)."""
        if version <= self.version:
            return None
        rebinding = None
        if self.onnx is not None:  # (single-agent)
            load_weights(self.module, weights)
            rebinding = self.onnx.rebind(version, self.module)
        elif isinstance(weights, dict):
            for module_id, module_weights in weights.items():
                load_weights(self.module[module_id], module_weights)
            changed = module_versions or {}
            self.module_versions.update({m: v for m, v in changed.items() if m in self.module_versions})
        else:
            load_weights(self.module, weights)
        if connector_state:
            self.env_to_module.set_state(connector_state)
        if self.onnx is None:
            self.version = version
        return rebinding

    def take_rebound(self) -> None:
        """Act with the newest onnxruntime sessions built by `set_weights`, if done (call between batches)."""
        version = self.onnx.ready() if self.onnx is not None else None
        if version is not None:
            self.version = version

    def take_connector_delta(self) -> dict[str, Any]:
        """The connector statistics gathered since the last call, for the learner to merge (between batches).

        The pieces' own view keeps them (their global statistics absorb the delta), so normalisation does not
        jump; the learner's merged state replaces it with the next weights.
        """
        state = self.env_to_module.get_state()
        if state:
            self.env_to_module.set_state(self.env_to_module.merge_states([state]))
        return state

    def freeze_statistics(self) -> None:
        """Keep the connector statistics as trained (MeanStdFilter's): acting no longer moves them. For policies
        that evaluate or act outside training."""
        for piece in self.env_to_module.connectors:
            if hasattr(piece, "update_stats"):
                piece.update_stats = False
