"""`rlgate export`'s work: a checkpoint's policy (one module of a multi-agent run) as an ONNX file's bytes."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlgate.connectors import ConnectorPipelineV2
from rlgate.connectors.env_to_module import MeanStdFilter
from rlgate.core import codec
from rlgate.core.errors import UserError
from rlgate.episodes.multi_agent_episode import DEFAULT_MODULE_ID, MultiAgentEpisode
from rlgate.export.actions import ActionSelection, env_action_flags
from rlgate.export.graph import PolicyGraph
from rlgate.export.onnx_file import to_onnx
from rlgate.export.pieces import NotExportable, fold
from rlgate.models import RLModule
from rlgate.spec.build import build_policy
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.multi_agent import agent_spaces_of, agent_to_module_mapping_fn, build_multi_agent_policy
from rlgate.storage import checkpoint


def policy_graph(
    env_to_module: ConnectorPipelineV2,
    module: RLModule,
    module_to_env: ConnectorPipelineV2,
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    explore: bool,
    module_only: bool,
    agent: str | None = None,
) -> PolicyGraph:
    """The graph of a policy whose env takes `observation_space` and `action_space` (`agent`'s in a multi-agent
    run): its env-to-module pieces folded in, or (`module_only`) the module's observations as inputs."""
    if module_only:
        selection = ActionSelection(module, action_space, explore)
        return PolicyGraph(module, [], selection, module.observation_space, module_only=True)
    selection = ActionSelection(module, action_space, explore, **env_action_flags(module_to_env))
    return PolicyGraph(module, fold(env_to_module.connectors, agent), selection, observation_space, module_only=False)


def export_checkpoint(
    path: Path,
    *,
    module_id: str | None = None,
    explore: bool = False,
    module_only: bool = False,
    allow_import: Iterable[str] = (),
) -> bytes:
    """The ONNX file of the checkpoint at `path` (or the newest in a folder of them): of `module_id` in a
    multi-agent run (needed where it has more than one module). UserError for what a person can fix."""
    found = checkpoint.load(path)
    imports = ImportPolicy(allow_import)
    spaces = found.observation_space, found.action_space
    options: dict[str, Any] = {"explore": explore, "module_only": module_only}
    with found.loading_weights():
        if found.module_weights is None:
            if module_id not in (None, DEFAULT_MODULE_ID):
                raise UserError(
                    f"--module {module_id}: the checkpoint in {found.directory} is single-agent (its one module is "
                    f"{DEFAULT_MODULE_ID!r})"
                )
            module_id = DEFAULT_MODULE_ID
            built = build_policy(
                found.spec, *spaces, imports, weights=found.weights, connector_state=found.connector_state
            )
            graph = policy_graph(built.env_to_module, built.module, built.module_to_env, *spaces, **options)
        else:
            agent_spaces = agent_spaces_of(*spaces)
            built_ma = build_multi_agent_policy(
                found.spec,
                agent_spaces,
                imports,
                module_weights=found.module_weights,
                connector_state=found.connector_state,
            )
            modules = built_ma.module.keys()
            if module_id is None and len(modules) == 1:
                module_id = modules[0]
            if module_id not in modules:
                choose = "choose one with --module" if module_id is None else f"no module {module_id!r} in it"
                raise UserError(f"the checkpoint in {found.directory} has modules {', '.join(modules)}: {choose}")
            assert module_id is not None  # one of the modules
            agent = _agent_of(found.spec, agent_spaces, built_ma.env_to_module, module_id, imports)
            spaces = agent_spaces[agent]
            module = built_ma.module[module_id]
            graph = policy_graph(
                built_ma.env_to_module, module, built_ma.module_to_env, *spaces, **options, agent=agent
            )
    return to_onnx(
        graph,
        {
            "rlgate_version": importlib.metadata.version("rlgate"),
            "model_version": found.version,
            "module_id": module_id,
            **options,
            "observation_space": codec.space_to_json(spaces[0] if not module_only else graph.module.observation_space),
            "action_space": codec.space_to_json(spaces[1]),
            "run_spec": found.spec.model_dump(mode="json"),
        },
    )


def _agent_of(spec: Any, agent_spaces: dict, env_to_module: ConnectorPipelineV2, module_id: str, imports: Any) -> str:
    """An agent that acts with `module_id` (its spaces are the file's). A MeanStdFilter keeps statistics per agent:
    with it, exactly one agent may map to the module (NotExportable otherwise)."""
    mapping = agent_to_module_mapping_fn(spec, imports)
    agents = [a for a in agent_spaces if _maps(mapping, a) == module_id]
    if not agents:  # a mapping that depends on the episode: every agent has the same spaces then
        agents = list(agent_spaces)
    if len(agents) > 1 and any(isinstance(p, MeanStdFilter) for p in env_to_module.connectors):
        raise NotExportable(
            f"MeanStdFilter keeps statistics per agent and agents {', '.join(agents)} act with module {module_id!r}: "
            "export the module alone with --module-only"
        )
    return agents[0]


def _maps(mapping: Any, agent: str) -> str | None:
    try:
        return mapping(agent, MultiAgentEpisode())
    except Exception:  # a user's mapping that needs a running episode
        return None
