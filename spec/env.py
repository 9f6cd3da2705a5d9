"""Making the env a run spec names: a registered id, an env class, a factory, or a module that registers ids."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
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
    gymnasium's (reset: (obs, info), step: (obs, reward, terminated, truncated, info)), and observations that
    do not fit its observation space (which a vector env or the server would only call "the wrong shape")."""

    def __init__(self, env: gym.Env, env_id: str) -> None:
        super().__init__(env)
        self.env_id = env_id
        self._misfit = observation_misfit(env.observation_space)

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
        misfit = self._misfit(result[0])
        if misfit is not None:
            raise EnvError(
                f"env {self.env_id}: {method}() returned an observation {misfit}, but its observation space is "
                f"{self.observation_space}"
            )
        return result


# What a checker says of an observation: None when it fits, else what is wrong ("of shape (5,)").
Misfit = Callable[[Any], str | None]


def observation_misfit(space: gym.Space, path: str = "") -> Misfit:
    """A checker of observations of `space`, prepared once: the structure (a Dict's keys, a Tuple's length),
    each array's shape and a Discrete's value. Cheap enough for every env step (a shape comparison per leaf);
    bounds and dtypes are the server's to check, where values arrive anyway. Other spaces pass unchecked."""
    at = f"whose {path} is" if path else "that is"
    if isinstance(space, gym.spaces.Dict):
        items = {key: observation_misfit(sub, f"{path}[{key!r}]") for key, sub in space.spaces.items()}
        keys = set(items)

        def check_dict(value: Any) -> str | None:
            if not isinstance(value, Mapping):
                return f"{at} a {type(value).__name__}, not a dict"
            if value.keys() != keys:
                return f"{at} a dict of keys {sorted(map(str, value))}, not {sorted(keys)}"
            for key, check in items.items():
                misfit = check(value[key])
                if misfit is not None:
                    return misfit
            return None

        return check_dict
    if isinstance(space, gym.spaces.Tuple):
        parts = [observation_misfit(sub, f"{path}[{i}]") for i, sub in enumerate(space.spaces)]

        def check_tuple(value: Any) -> str | None:
            # As gymnasium's Tuple.contains: a tuple, or a list or array of the parts.
            sequence = isinstance(value, tuple | list) or (isinstance(value, np.ndarray) and value.ndim >= 1)
            if not sequence or len(value) != len(parts):
                got = f"{type(value).__name__} of {len(value)}" if sequence else type(value).__name__
                return f"{at} a {got}, not a tuple of {len(parts)}"
            for check, item in zip(parts, value, strict=True):
                misfit = check(item)
                if misfit is not None:
                    return misfit
            return None

        return check_tuple
    if isinstance(space, gym.spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n)

        def check_discrete(value: Any) -> str | None:
            try:
                number = operator.index(value)  # int, numpy integers and 0-d integer arrays; not floats
            except TypeError:
                return f"{at} {value!r}, not an integer"
            return None if low <= number < high else f"{at} {number}, outside {space}"

        return check_discrete
    if isinstance(space, gym.spaces.Box | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        shape, has = space.shape, f"whose {path} has shape" if path else "of shape"

        def check_shape(value: Any) -> str | None:
            got = np.shape(value)
            return None if got == shape else f"{has} {got}"

        return check_shape
    return lambda _value: None


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
