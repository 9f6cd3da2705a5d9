"""Making the env a run spec names: a registered id, an env class, a factory, or a module that registers ids."""

from __future__ import annotations

import functools
from collections.abc import Callable

import gymnasium as gym

from rlgate.spec.imports import ImportPolicy, SpecError, split_path
from rlgate.spec.run import EnvSpec


def env_factory(spec: EnvSpec, imports: ImportPolicy) -> Callable[[], gym.Env]:
    """A no-argument callable that makes one env of `spec` (with its kwargs)."""
    if ":" not in spec.id:
        return functools.partial(_make_registered, spec.id, spec.kwargs)
    module, attribute = split_path(spec.id)
    if attribute.isidentifier():
        target = imports.load(spec.id, "env.id")
        if not callable(target):
            raise SpecError(f"env.id: {spec.id!r} is neither an env class nor a function that makes an env")
        return functools.partial(target, **spec.kwargs)
    imports.import_module(module, "env.id")  # importing the module registers its ids ("pkg.mod:Env-v0")
    return functools.partial(_make_registered, attribute, spec.kwargs)


def make_env(spec: EnvSpec, imports: ImportPolicy, num_envs: int | None = None) -> gym.Env | gym.vector.VectorEnv:
    """One env for one sub-env, else a vector env of `num_envs` (spec.num_envs) with NEXT_STEP autoreset,
    its sub-envs in this process (sync) or one subprocess each (async)."""
    n = spec.num_envs if num_envs is None else num_envs
    factory = env_factory(spec, imports)
    if n == 1:
        return factory()
    vector = gym.vector.AsyncVectorEnv if spec.vectorize == "async" else gym.vector.SyncVectorEnv
    return vector([factory] * n)


def make_agent_envs(spec: EnvSpec, imports: ImportPolicy, num_envs: int | None = None) -> list:
    """`num_envs` (spec.num_envs) multi-agent (PettingZoo) envs, the sub-envs of one multi-agent client."""
    factory = env_factory(spec, imports)
    return [factory() for _ in range(spec.num_envs if num_envs is None else num_envs)]


def env_spaces(spec: EnvSpec, imports: ImportPolicy) -> tuple[gym.Space, gym.Space]:
    """The observation and action space of one env (made once and closed)."""
    env = env_factory(spec, imports)()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def run_spaces(spec: EnvSpec, multi_agent: bool, imports: ImportPolicy) -> tuple[gym.Space, gym.Space]:
    """The env's observation and action space; multi-agent: Dicts of the agents' spaces by agent id."""
    if not multi_agent:
        return env_spaces(spec, imports)
    agents = agent_spaces(spec, imports)
    return (
        gym.spaces.Dict({agent: pair[0] for agent, pair in agents.items()}),
        gym.spaces.Dict({agent: pair[1] for agent, pair in agents.items()}),
    )


def is_multi_agent_env(env: object) -> bool:
    """A PettingZoo ParallelEnv or AECEnv (told by its API: `possible_agents`, per-agent space methods)."""
    return hasattr(env, "possible_agents") and callable(getattr(env, "observation_space", None))


def agent_spaces(spec: EnvSpec, imports: ImportPolicy) -> dict[str, tuple[gym.Space, gym.Space]]:
    """agent id -> (observation space, action space) of a multi-agent env (made once and closed), in the
    order of its `possible_agents`."""
    env = env_factory(spec, imports)()
    try:
        if not is_multi_agent_env(env):
            raise SpecError(f"env.id: {spec.id!r} is not a PettingZoo ParallelEnv or AECEnv, but [multi_agent] is set")
        return {agent: (env.observation_space(agent), env.action_space(agent)) for agent in env.possible_agents}
    finally:
        env.close()


def _make_registered(env_id: str, kwargs: dict) -> gym.Env:
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as exc:
        raise SpecError(f"env.id: {exc}") from exc
