"""A run spec's policy, built: its connector pipelines and its RLModule, for given env spaces.

The server and the learner both build through these functions, so both run the same pieces and build
the same module. User code named in the spec is imported through the process's ImportPolicy.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from rlgate.connectors import ConnectorPipelineV2, ConnectorV2, common, env_to_module, learner, module_to_env
from rlgate.connectors.builders import (
    build_env_to_module_pipeline,
    build_learner_pipeline,
    build_module_to_env_pipeline,
)
from rlgate.connectors.env_to_module import FlattenObservations
from rlgate.models import ModelConfig, RLModule, build_module, dist_inputs_misfit, load_weights, missing_outputs
from rlgate.models.catalog import check_flattenable, encodes
from rlgate.models.dqn import DQNModule
from rlgate.models.sac import SACModule
from rlgate.spec.algorithm import scheduled
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.run import PieceSpec, RunSpec


def _builtin_pieces() -> dict[str, Callable[..., ConnectorV2]]:
    """Every connector piece rlgate ships, by its RLlib name (FrameStackingEnvToModule, MeanStdFilter, ...)."""
    pieces = {}
    for package in (common, env_to_module, module_to_env, learner):
        for name in package.__all__:
            factory = getattr(package, name)
            target = getattr(factory, "func", factory)  # FrameStackingEnvToModule is a partial of FrameStacking
            if isinstance(target, type) and issubclass(target, ConnectorV2) and not inspect.isabstract(target):
                pieces[name] = factory
    return pieces


BUILTIN_PIECES = _builtin_pieces()


def build_piece(piece: PieceSpec, imports: ImportPolicy, what: str) -> ConnectorV2:
    """One connector piece of a spec: a built-in by name, or the user's class by import path."""
    if ":" in piece.type:
        factory = imports.load(piece.type, what)
        if not (isinstance(factory, type) and issubclass(factory, ConnectorV2)):
            raise SpecError(f"{what}: {piece.type!r} is not a ConnectorV2 subclass")
    else:
        factory = BUILTIN_PIECES.get(piece.type)
        if factory is None:
            raise SpecError(
                f"{what}: no built-in connector piece {piece.type!r} (built-ins: {', '.join(sorted(BUILTIN_PIECES))}); "
                "a piece of your own is 'package.module:Class'"
            )
    accepted = _keyword_arguments(getattr(factory, "func", factory))
    unknown = sorted(set(piece.kwargs) - accepted)
    if unknown:
        raise SpecError(
            f"{what}: {piece.type} takes no argument {', '.join(unknown)} (it takes: {', '.join(sorted(accepted))})"
        )
    try:
        return factory(**piece.kwargs)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{what}: {piece.type}({piece.kwargs}): {exc}") from exc


def _keyword_arguments(cls: type) -> set[str]:
    """The named arguments the constructors of `cls` and its bases take (pieces pass **kwargs upwards,
    so an unknown name would otherwise vanish without a word)."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            names |= {p.name for p in inspect.signature(init).parameters.values() if p.kind in kinds}
    return names - {"self", "input_observation_space", "input_action_space"}


def build_pieces(
    pieces: list[PieceSpec], imports: ImportPolicy, pipeline: str, *, multi_agent: bool
) -> list[ConnectorV2]:
    """The pieces a spec lists for one pipeline ("env_to_module", "module_to_env" or "learner") of a single- or
    multi-agent run. A piece with RLlib's `multi_agent` option must have it as the run is: left False, it would
    meet MultiAgentEpisodes (or spaces by agent id) at the first step; True, single-agent ones (SpecError)."""
    built = []
    for i, piece_spec in enumerate(pieces):
        what = f"connectors.{pipeline}[{i}]"
        piece = build_piece(piece_spec, imports, what)
        option = getattr(piece, "multi_agent", None)
        if option is True and not multi_agent:
            raise SpecError(
                f"{what}: {piece_spec.type} has multi_agent = true, but this spec is single-agent (no [multi_agent] "
                "section): drop the option"
            )
        if option is False and multi_agent:
            raise SpecError(
                f"{what}: {piece_spec.type} runs on multi-agent episodes here: set multi_agent = true (RLlib's "
                f'option), e.g. {{ type = "{piece_spec.type}", multi_agent = true }}'
            )
        built.append(piece)
    return built


def output_space(pieces: list[ConnectorV2], observation_space: gym.Space, action_space: gym.Space) -> gym.Space:
    """The observation space after a spec's env-to-module `pieces`; SpecError (in one line) for a space one of
    them cannot take (FrameStacking a Discrete observation)."""
    try:
        output = ConnectorPipelineV2(observation_space, action_space, connectors=list(pieces)).observation_space
    except ValueError as exc:
        raise SpecError(f"connectors.env_to_module: {exc}") from exc
    assert output is not None  # a pipeline built on a space has an output space
    return output


def build_env_to_module(
    spec: RunSpec, observation_space: gym.Space, action_space: gym.Space, imports: ImportPolicy, device: str = "cpu"
) -> ConnectorPipelineV2:
    """The spec's env-to-module pipeline; its output observation space is the module's.

    With the default model, observations its encoders cannot take (Dict, Tuple, Discrete, ...) after the
    user's pieces are flattened by a FlattenObservations piece appended to them, so every gymnasium space
    works out of the box.
    """

    def pieces(obs: gym.Space, act: gym.Space) -> list[ConnectorV2]:
        user = build_pieces(spec.connectors.env_to_module, imports, "env_to_module", multi_agent=False)
        output = output_space(user, obs, act)
        if spec.model.module_class is None and not encodes(output):
            check_flattenable(output)
            user.append(FlattenObservations())
        return user

    return build_env_to_module_pipeline(observation_space, action_space, env_to_module_connector=pieces, device=device)


def build_module_to_env(
    spec: RunSpec, observation_space: gym.Space, action_space: gym.Space, imports: ImportPolicy
) -> ConnectorPipelineV2:
    """The spec's module-to-env pipeline (the env's spaces)."""
    return build_module_to_env_pipeline(
        observation_space,
        action_space,
        module_to_env_connector=lambda _o, _a: build_pieces(
            spec.connectors.module_to_env, imports, "module_to_env", multi_agent=False
        ),
    )


def build_learner_connector(
    spec: RunSpec, observation_space: gym.Space, action_space: gym.Space, imports: ImportPolicy, device: str = "cpu"
) -> ConnectorPipelineV2:
    """The spec's learner pipeline with its algorithm's pieces (`algorithm_pieces`); the spaces are the module's."""
    return build_learner_pipeline(
        observation_space,
        action_space,
        learner_connector=lambda _o, _a: build_pieces(spec.connectors.learner, imports, "learner", multi_agent=False),
        device=device,
        **algorithm_pieces(spec),
    )


def algorithm_pieces(spec: RunSpec) -> dict[str, Any]:
    """`build_learner_pipeline`'s options for the spec's algorithm: PPO's GAE (with AddOneTsToEpisodesAndTruncate),
    or DQN's and SAC's AddNextObservationsFromEpisodesToTrainBatch."""
    algorithm = spec.algorithm
    if algorithm.name == "PPO":
        return {"gae": (algorithm.gamma, algorithm.lambda_)}
    return {"next_observations": True}


@contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Weights initialised inside are the same in every process for a seed: torch's RNG seeded, on one thread
    (an orthogonal init's QR rounds differently on more), so a server's fresh version 0 is the learner's."""
    if seed is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build_rl_module(
    spec: RunSpec, observation_space: gym.Space, action_space: gym.Space, imports: ImportPolicy
) -> RLModule:
    """The spec's module for these (env-to-module output) spaces, seeded with spec.seed when set."""
    with seeded(spec.seed):
        if spec.model.module_class is None:
            return default_module(spec, observation_space, action_space)
        cls = imports.load(spec.model.module_class, "model.module_class")
        if not (isinstance(cls, type) and issubclass(cls, RLModule)):
            raise SpecError(f"model.module_class: {spec.model.module_class!r} is not an rlgate RLModule subclass")
        base = {"DQN": DQNModule, "SAC": SACModule}.get(spec.algorithm.name)
        if base is not None and not issubclass(cls, base):  # their learners call its Q networks by name
            raise SpecError(
                f"model.module_class: {spec.algorithm.name} trains a subclass of rlgate.models.{base.__name__}; "
                f"{spec.model.module_class!r} is not one"
            )
        module = cls(observation_space, action_space, dict(spec.model.config))
        misfit = missing_outputs(module) or dist_inputs_misfit(module)
        if misfit is not None:  # it would give no actions, or actions outside the space, which the env then refuses
            raise SpecError(f"model.module_class: {spec.model.module_class!r}: {misfit}")
        return module


def default_module(spec: RunSpec, observation_space: gym.Space, action_space: gym.Space) -> RLModule:
    """rlgate's module for the spec's algorithm: PPO's actor-critic, DQN's Q network (its dueling heads and
    initial epsilon from the algorithm's fields, as RLlib's model_config auto-includes them) or SAC's policy and Q
    networks. Action spaces the algorithm does not take are a SpecError naming algorithm.name."""
    config, algorithm = ModelConfig.from_dict(spec.model.config), spec.algorithm
    if algorithm.name == "PPO":
        return build_module(observation_space, action_space, config)
    cls = DQNModule if algorithm.name == "DQN" else SACModule
    misfit = cls.action_space_misfit(action_space)
    if misfit:
        raise SpecError(f"algorithm.name: {misfit}")
    if config.use_lstm:  # the replay buffer samples single transitions, with no state to run a sequence from
        raise SpecError(f"model.config.use_lstm: {algorithm.name} takes stateless modules (no LSTM)")
    if algorithm.name == "DQN":
        epsilon = scheduled(algorithm.epsilon, 0)
        return DQNModule(observation_space, action_space, config, dueling=algorithm.dueling, epsilon=epsilon)
    return SACModule(observation_space, action_space, config, twin_q=algorithm.twin_q)


@dataclass
class BuiltPolicy:
    """What computes actions: the env-to-module pipeline, the module and the module-to-env pipeline."""

    env_to_module: ConnectorPipelineV2
    module: RLModule
    module_to_env: ConnectorPipelineV2


def build_policy(
    spec: RunSpec,
    observation_space: gym.Space,
    action_space: gym.Space,
    imports: ImportPolicy,
    *,
    weights: bytes | None = None,
    connector_state: dict[str, Any] | None = None,
    device: str = "cpu",
) -> BuiltPolicy:
    """The spec's policy for these env spaces, fresh or with these weights and connector state (e.g.
    MeanStdFilter statistics), its module on `device` in eval mode: what a server serves and what
    `rlgate.policy.Policy` acts with."""
    env_to_module = build_env_to_module(spec, observation_space, action_space, imports, device=device)
    if connector_state:
        env_to_module.set_state(connector_state)
    assert env_to_module.observation_space is not None  # built on a space
    module = build_rl_module(spec, env_to_module.observation_space, action_space, imports)
    if weights is not None:
        load_weights(module, weights)
    module.to(device).eval()
    return BuiltPolicy(env_to_module, module, build_module_to_env(spec, observation_space, action_space, imports))
