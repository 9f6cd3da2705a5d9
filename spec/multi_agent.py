"""A multi-agent run spec's policy, built: agent -> module mapping, module spaces, pipelines, MultiRLModule.

The server and the learner both build through these functions (as `spec.policy` does for single-agent
runs), so both map agents to the same modules and build the same modules and pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rlgate.connectors import ConnectorPipelineV2, ConnectorV2
from rlgate.connectors.builders import (
    build_env_to_module_pipeline,
    build_learner_pipeline,
    build_module_to_env_pipeline,
)
from rlgate.connectors.common.frame_stacking import FrameStacking
from rlgate.connectors.env_to_module import FlattenObservations, MeanStdFilter
from rlgate.episodes.multi_agent_episode import MappingFn, MultiAgentEpisode, default_agent_to_module_mapping_fn
from rlgate.models import ModelConfig, MultiRLModule, load_weights, parameter_count
from rlgate.models.catalog import MAX_PARAMETERS, UnsupportedSpace, encodes
from rlgate.spec.build import algorithm_pieces, build_pieces, build_rl_module, output_space, seeded
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.run import PER_AGENT, SHARED, RunSpec

#: agent id -> (observation space, action space), as the env declares them.
AgentSpaces = dict[str, tuple[gym.Space, gym.Space]]


def _per_agent(agent_id: str, episode: MultiAgentEpisode) -> str:
    """The built-in "one module per agent" mapping: the module is named by its agent."""
    return str(agent_id)


def agent_to_module_mapping_fn(spec: RunSpec, imports: ImportPolicy) -> MappingFn:
    """The spec's mapping: built-in (shared, per_agent) or the user's function by import path."""
    assert spec.multi_agent is not None  # a multi-agent run's spec
    path = spec.multi_agent.policy_mapping_fn
    if path == SHARED:
        return default_agent_to_module_mapping_fn
    if path == PER_AGENT:
        return _per_agent
    fn = imports.load(path, "multi_agent.policy_mapping_fn")
    if not callable(fn):
        raise SpecError(f"multi_agent.policy_mapping_fn: {path!r} is not a function (agent_id, episode) -> module id")
    declared = spec.multi_agent.policies or []

    def checked(agent_id: str, episode: MultiAgentEpisode) -> str:
        """The user's mapping, held to `policies` (it may depend on the episode: no start-up probe checks it)."""
        module_id = fn(agent_id, episode)
        if module_id not in declared:
            raise SpecError(
                f"multi_agent.policy_mapping_fn {path!r} mapped agent {agent_id!r} to module {module_id!r}, "
                f"not in policies {declared}"
            )
        return module_id

    return checked


def module_spaces(
    spec: RunSpec, agent_spaces: AgentSpaces, imports: ImportPolicy
) -> dict[str, tuple[gym.Space, gym.Space]]:
    """module id -> (observation space, action space), as RLlib 2.60's `get_multi_agent_setup` infers them.

    When every agent has the same spaces, every module in `policies` gets them: a mapping function of the
    user's is not probed, so it may depend on the episode (self-play against an opponent drawn per game).
    Otherwise, and for the built-in mappings (which ignore the episode), each agent is mapped once, with an
    empty episode, and its module gets its spaces. Raises SpecError when agents of one module have different
    spaces, when an agent maps to a module not in `policies`, or when a module in `policies` gets no agent
    (its spaces are unknown).
    """
    assert spec.multi_agent is not None  # a multi-agent run's spec
    mapping, declared = agent_to_module_mapping_fn(spec, imports), spec.multi_agent.policies
    every = list(agent_spaces.values())
    builtin = spec.multi_agent.policy_mapping_fn in (SHARED, PER_AGENT)  # they ignore the episode: probed exactly
    if declared and not builtin and all(spaces == every[0] for spaces in every):
        return {module_id: every[0] for module_id in declared}
    found: dict[str, tuple[gym.Space, gym.Space]] = {}
    owner: dict[str, str] = {}
    for agent_id, spaces in agent_spaces.items():
        module_id = mapping(agent_id, MultiAgentEpisode())
        if declared and module_id not in declared:
            raise SpecError(f"multi_agent: agent {agent_id!r} maps to module {module_id!r}, not in policies {declared}")
        if module_id in found and found[module_id] != spaces:
            raise SpecError(
                f"multi_agent: agents {owner[module_id]!r} and {agent_id!r} map to module {module_id!r} but have "
                f"different spaces ({found[module_id]} and {spaces}): map them to separate modules"
            )
        found[module_id], owner[module_id] = spaces, agent_id
    missing = sorted(set(declared or ()) - set(found))
    if missing:
        raise SpecError(
            f"multi_agent: no agent of the env maps to modules {missing} (agents: {list(agent_spaces)}), so their "
            "spaces are unknown"
        )
    order = declared or list(found)
    return {module_id: found[module_id] for module_id in order}


def modules_to_train(spec: RunSpec, module_ids: list[str]) -> list[str]:
    """The modules the learner updates (policies_to_train, default all)."""
    assert spec.multi_agent is not None  # a multi-agent run's spec
    wanted = spec.multi_agent.policies_to_train
    return [m for m in module_ids if wanted is None or m in wanted]


def spaces_by_agent(agent_spaces: AgentSpaces) -> tuple[gym.spaces.Dict, gym.spaces.Dict]:
    """agent id -> (observation space, action space) as two Dict spaces by agent id (how weights and checkpoints
    carry a multi-agent env's spaces)."""
    return (
        gym.spaces.Dict({a: spaces[0] for a, spaces in agent_spaces.items()}),
        gym.spaces.Dict({a: spaces[1] for a, spaces in agent_spaces.items()}),
    )


def agent_spaces_of(observation_space: gym.Space, action_space: gym.Space) -> AgentSpaces:
    """Two Dict spaces by agent id as agent id -> (observation space, action space): `spaces_by_agent`'s inverse."""
    assert isinstance(observation_space, gym.spaces.Dict) and isinstance(action_space, gym.spaces.Dict)
    return {agent: (observation_space[agent], action_space[agent]) for agent in observation_space.spaces}


def build_multi_agent_env_to_module(
    spec: RunSpec, agent_spaces: AgentSpaces, imports: ImportPolicy, device: str = "cpu"
) -> ConnectorPipelineV2:
    """The spec's env-to-module pipeline over MultiAgentEpisodes (ending in AgentToModuleMapping): its output
    observation space is a Dict of the modules' observation spaces.

    With the default model, agents whose observations (after the user's pieces) its encoders cannot take are
    flattened by a FlattenObservations(multi_agent=True) appended to the user's pieces. After a
    FrameStackingEnvToModule, which stacks into the batch only, no piece may change observations (SpecError),
    that one included: 2-D frames are flattened before it by the user's.
    """
    observation_space, action_space = spaces_by_agent(agent_spaces)
    user = build_pieces(spec.connectors.env_to_module, imports, "env_to_module", multi_agent=True)
    output = output_space(user, observation_space, action_space)
    assert isinstance(output, gym.spaces.Dict)  # multi-agent pieces keep {agent id: space}
    _check_after_frame_stacking(user)
    if spec.model.module_class is None:
        flat = [a for a, space in output.spaces.items() if not encodes(space)]
        if flat:
            if any(isinstance(piece, FrameStacking) for piece in user):
                raise SpecError(
                    f"connectors.env_to_module: the default model takes 1-D or image (H, W, C) Box observations, not "
                    f"agent {flat[0]!r}'s stacked frames {output[flat[0]]}: put "
                    '{ type = "FlattenObservations", multi_agent = true } before FrameStackingEnvToModule'
                )
            user.append(FlattenObservations(multi_agent=True, agent_ids=flat))
            output = output_space(user, observation_space, action_space)
            assert isinstance(output, gym.spaces.Dict)
    modules = module_spaces(spec, {a: (output[a], agent_spaces[a][1]) for a in agent_spaces}, imports)
    return build_env_to_module_pipeline(
        observation_space,
        action_space,
        env_to_module_connector=lambda _o, _a: user,
        device=device,
        module_spaces=modules,
    )


def _check_after_frame_stacking(pieces: list[ConnectorV2]) -> None:
    """SpecError for a piece after a FrameStacking that changes observations: multi-agent pieces change them in
    the episodes, but the stacks are in the batch (the episodes keep single frames), so the module would get
    stacks its space does not describe. Such a piece changes the space, or is a MeanStdFilter (unclipped over
    an unbounded Box, it normalises within its input's space)."""
    stacking = next((i for i, piece in enumerate(pieces) if isinstance(piece, FrameStacking)), None)
    if stacking is None:
        return
    for i, piece in enumerate(pieces[stacking + 1 :], stacking + 1):
        if piece.observation_space != piece.input_observation_space or isinstance(piece, MeanStdFilter):
            raise SpecError(
                f"connectors.env_to_module[{i}]: {type(piece).__name__} changes the observations that "
                f"FrameStackingEnvToModule (connectors.env_to_module[{stacking}]) has stacked already: put it before"
            )


def pipeline_module_spaces(env_to_module: ConnectorPipelineV2) -> dict[str, tuple[gym.Space, gym.Space]]:
    """module id -> the spaces its module is built for: the output spaces of a multi-agent env-to-module pipeline
    (`build_multi_agent_env_to_module`'s), in its modules' order."""
    assert isinstance(env_to_module.observation_space, gym.spaces.Dict)  # {module id: space}
    assert isinstance(env_to_module.action_space, gym.spaces.Dict)
    return {
        m: (env_to_module.observation_space[m], env_to_module.action_space[m])
        for m in env_to_module.observation_space.spaces
    }


def episode_module_spaces(
    spec: RunSpec, agent_spaces: AgentSpaces, env_to_module: ConnectorPipelineV2, imports: ImportPolicy
) -> dict[str, tuple[gym.Space, gym.Space]]:
    """module id -> the spaces of its agents' episodes after `env_to_module` (the spec's) ran over them: what
    their chunks hold. The modules' own spaces, but for a FrameStackingEnvToModule's frames, which it stacks
    into the batch only (the pieces after it change no observations: `_check_after_frame_stacking`)."""
    stacking = next((piece for piece in env_to_module.connectors if isinstance(piece, FrameStacking)), None)
    if stacking is None:
        return pipeline_module_spaces(env_to_module)
    frames = stacking.input_observation_space
    assert isinstance(frames, gym.spaces.Dict)  # {agent id: space}
    return module_spaces(spec, {a: (frames[a], agent_spaces[a][1]) for a in agent_spaces}, imports)


def build_multi_agent_module_to_env(
    spec: RunSpec, agent_spaces: AgentSpaces, imports: ImportPolicy
) -> ConnectorPipelineV2:
    """The spec's module-to-env pipeline: one `{agent id: action}` dict per episode, actions in each agent's space."""
    return build_module_to_env_pipeline(
        *spaces_by_agent(agent_spaces),
        module_to_env_connector=lambda _o, _a: build_pieces(
            spec.connectors.module_to_env, imports, "module_to_env", multi_agent=True
        ),
        multi_agent=True,
    )


def build_multi_agent_learner_connector(
    spec: RunSpec, modules: dict[str, tuple[gym.Space, gym.Space]], imports: ImportPolicy, device: str = "cpu"
) -> ConnectorPipelineV2:
    """The spec's learner pipeline with its algorithm's pieces, ending in per-module batches (GAE per module)."""
    return build_learner_pipeline(
        gym.spaces.Dict({m: spaces[0] for m, spaces in modules.items()}),
        gym.spaces.Dict({m: spaces[1] for m, spaces in modules.items()}),
        learner_connector=lambda _o, _a: build_pieces(spec.connectors.learner, imports, "learner", multi_agent=True),
        device=device,
        module_spaces=modules,
        **algorithm_pieces(spec),
    )


def build_multi_rl_module(
    spec: RunSpec, modules: dict[str, tuple[gym.Space, gym.Space]], imports: ImportPolicy
) -> MultiRLModule:
    """One module of the spec's model per module id, for its (env-to-module output) spaces; seeded once.

    The default model's modules hold at most MAX_PARAMETERS in all, as one default model does (UnsupportedSpace,
    before any is built): a module per agent (per_agent mapping), for a hello's agents, would otherwise make as
    many as a client declares."""
    if spec.model.module_class is None:
        config = ModelConfig.from_dict(spec.model.config)
        total = sum(parameter_count(*spaces, config) for spaces in modules.values())
        if total > MAX_PARAMETERS:
            raise UnsupportedSpace(
                f"The default model's {len(modules)} modules would have {total:,} parameters in all, more than the "
                f"{MAX_PARAMETERS:,} (2**28) rlgate builds. Map agents to fewer modules (multi_agent.policy_mapping_fn)"
                f" or use smaller ones (model.config fcnet_hiddens)."
            )
    unseeded = spec.model_copy(update={"seed": None})
    with seeded(spec.seed):
        return MultiRLModule({m: build_rl_module(unseeded, *spaces, imports) for m, spaces in modules.items()})


@dataclass
class BuiltMultiAgentPolicy:
    """What computes a multi-agent batch's actions: the pipelines, the MultiRLModule and the agent -> module map."""

    env_to_module: ConnectorPipelineV2
    module: MultiRLModule
    module_to_env: ConnectorPipelineV2
    mapping_fn: MappingFn


def build_multi_agent_policy(
    spec: RunSpec,
    agent_spaces: AgentSpaces,
    imports: ImportPolicy,
    *,
    module_weights: dict[str, bytes] | None = None,
    connector_state: dict[str, Any] | None = None,
    device: str = "cpu",
) -> BuiltMultiAgentPolicy:
    """The spec's multi-agent policy for these agents' spaces, fresh or with these module weights and connector
    state, its modules on `device` in eval mode: what a server serves and what `rlgate.policy.MultiAgentPolicy`
    acts with."""
    env_to_module = build_multi_agent_env_to_module(spec, agent_spaces, imports, device=device)
    if connector_state:
        env_to_module.set_state(connector_state)
    assert isinstance(env_to_module.observation_space, gym.spaces.Dict)  # {module id: space}
    assert isinstance(env_to_module.action_space, gym.spaces.Dict)
    modules = {
        m: (env_to_module.observation_space[m], env_to_module.action_space[m])
        for m in env_to_module.observation_space.spaces
    }
    module = build_multi_rl_module(spec, modules, imports)
    for module_id, weights in (module_weights or {}).items():
        load_weights(module[module_id], weights)
    module.to(device).eval()
    return BuiltMultiAgentPolicy(
        env_to_module,
        module,
        build_multi_agent_module_to_env(spec, agent_spaces, imports),
        agent_to_module_mapping_fn(spec, imports),
    )
