"""Making the env a run spec names: a registered id, an env class, a factory, or a module that registers ids."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.errors import UserError
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
    factory = functools.partial(checked_env, env_factory(spec, imports), spec.id)
    if n == 1:
        return factory()
    vector = gym.vector.AsyncVectorEnv if spec.vectorize == "async" else gym.vector.SyncVectorEnv
    return vector([factory] * n)


class EnvError(UserError):
    """The env the spec names is not a gymnasium env, raised, or returned what its spaces do not hold."""


def checked_env(factory: Callable[[], Any], env_id: str) -> CheckedEnv:
    """`factory()`, which must make a gymnasium env with spaces; EnvError, naming `env_id`, if it raises or does not."""
    try:
        env = factory()
    except UserError:
        raise
    except Exception as exc:
        raise EnvError(f"env {env_id}: {_raised('__init__', exc)}") from exc
    if not isinstance(env, gym.Env):
        raise EnvError(f"env {env_id}: made {type(env).__name__!r}, which is not a gymnasium.Env")
    for name in ("observation_space", "action_space"):
        if not isinstance(getattr(env, name, None), gym.Space):
            raise EnvError(f"env {env_id}: its {name} is not a gymnasium space (set it in __init__)")
    return CheckedEnv(env, env_id)


class CheckedEnv(gym.Wrapper):
    """An env whose failures say which env and method failed: its own exceptions, results that are not
    gymnasium's (reset: (obs, info), step: (obs, reward, terminated, truncated, info)), and a Box observation
    of another shape than its space's (which a vector env would only call "the wrong shape")."""

    def __init__(self, env: gym.Env, env_id: str) -> None:
        super().__init__(env)
        self.env_id = env_id

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        return self._checked("reset", 2, seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict]:
        return self._checked("step", 5, action)

    def _checked(self, method: str, length: int, *args: Any, **kwargs: Any) -> Any:
        try:
            result = getattr(self.env, method)(*args, **kwargs)
        except Exception as exc:
            raise EnvError(f"env {self.env_id}: {_raised(method, exc)}") from exc
        if not isinstance(result, tuple) or len(result) != length:
            got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
            raise EnvError(
                f"env {self.env_id}: {method}() returned {got}, not the {length} values of gymnasium's API "
                "(an env written for gym before 0.26?)"
            )
        space = self.observation_space
        if isinstance(space, gym.spaces.Box) and np.shape(result[0]) != space.shape:
            raise EnvError(
                f"env {self.env_id}: {method}() returned an observation of shape {np.shape(result[0])}, "
                f"but its observation space is {space}"
            )
        return result


def _raised(method: str, error: Exception) -> str:
    return f"{method}() raised {type(error).__name__}: {error}"


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
