"""Making the env a run spec names: a registered id, an env class, a factory, or a module that registers ids."""

from __future__ import annotations

import functools
import importlib
import operator
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np

from rlgate.core.agents_step import is_aec
from rlgate.core.codec import UnencodableSpace, space_to_proto
from rlgate.core.errors import UserError
from rlgate.spec.imports import ImportPolicy, SpecError, split_path
from rlgate.spec.run import EnvSpec, WrapperSpec


def env_factory(spec: EnvSpec, imports: ImportPolicy) -> Callable[[], gym.Env]:
    """A no-argument callable that makes one env of `spec` (with its kwargs), wrapped in its wrappers in order.

    The wrappers are imported here, so one that does not import fails at once, naming it. Each one the env
    is wrapped in is checked as the env is (`checked_env`): an error in it, spaces that are none, or
    observations outside its own observation space name that wrapper."""
    make = _unwrapped_factory(spec, imports)
    if not spec.wrappers:
        return make
    wrappers = [
        (f"{spec.id}, wrapped by env.wrappers[{i}] ({wrapper.type})", _wrapper(wrapper, imports, i), wrapper.kwargs)
        for i, wrapper in enumerate(spec.wrappers)
    ]
    return functools.partial(_wrapped, make, spec.id, wrappers)


def _unwrapped_factory(spec: EnvSpec, imports: ImportPolicy) -> Callable[[], gym.Env]:
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


def _wrapper(wrapper: WrapperSpec, imports: ImportPolicy, index: int) -> Callable[..., gym.Env]:
    """The wrapper a spec names: gymnasium's by name, else by import path (under the import policy)."""
    what = f"env.wrappers[{index}]"
    if ":" in wrapper.type:
        target = imports.load(wrapper.type, what)
    else:
        target = getattr(gym.wrappers, wrapper.type, None)
        if not (isinstance(target, type) and issubclass(target, gym.Wrapper)):
            raise SpecError(
                f"{what}: gymnasium.wrappers has no wrapper {wrapper.type!r}; name one of yours as 'pkg.mod:Wrapper'"
            )
    if not callable(target):
        raise SpecError(f"{what}: {wrapper.type!r} is not a wrapper (a class or function taking the env)")
    return target


def _wrapped(
    make: Callable[[], gym.Env], env_id: str, wrappers: list[tuple[str, Callable[..., gym.Env], dict[str, Any]]]
) -> CheckedEnv:
    """The env, then each wrapper around the one before, each checked under its own name."""
    env = checked_env(make, env_id)
    for label, wrapper, kwargs in wrappers:
        env = checked_env(functools.partial(wrapper, env, **kwargs), label)
    try:
        space_to_proto(env.observation_space), space_to_proto(env.action_space)
    except UnencodableSpace as exc:
        raise EnvError(f"env {label}: {exc}") from None
    return env


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
    env = _made(factory, env_id)
    if isinstance(env, CheckedEnv):  # checked already (a wrapped env: under its last wrapper's name)
        return env
    if is_multi_agent_env(env):
        raise EnvError(
            f"env {env_id}: made a PettingZoo env ({type(env).__name__}), which runs with a [multi_agent] section in "
            'the run spec (e.g. policy_mapping_fn = "shared"; README, "Multi-agent envs")'
        )
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
        except EnvError:  # a wrapped env's own, naming it
            raise
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
        if method == "step" and (misfit := _reward_misfit(result[1])) is not None:
            raise EnvError(f"env {self.env_id}: step() returned {misfit}")
        return result


def _made(factory: Callable[[], Any], env_id: str) -> Any:
    """`factory()`; EnvError naming `env_id` and what it raised, if it raises."""
    try:
        return factory()
    except UserError:
        raise
    except Exception as exc:
        raise EnvError(f"env {env_id}: {_raised('__init__', exc)}") from exc


def _reward_misfit(reward: Any) -> str | None:
    """None for a reward that is one number (Python's or numpy's, a 0-d array too), else what it is: a vector
    env, or rlgate's multi-agent client, would only fail on it with numpy's "setting an array element..."."""
    if type(reward) is float or type(reward) is int:  # the common case, before numpy's look
        return None
    array = np.asarray(reward)
    if array.ndim == 0 and array.dtype.kind in "biuf":
        return None
    shape = f" of shape {array.shape}" if array.ndim else ""
    return f"a reward {reward!r} ({type(reward).__name__}{shape}), not a number"


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


def make_agent_envs(spec: EnvSpec, imports: ImportPolicy, num_envs: int | None = None) -> list[CheckedAgentEnv]:
    """`num_envs` (spec.num_envs) multi-agent (PettingZoo) envs, the sub-envs of one multi-agent client."""
    factory = env_factory(spec, imports)
    return [checked_agent_env(factory, spec.id) for _ in range(spec.num_envs if num_envs is None else num_envs)]


def checked_agent_env(factory: Callable[[], Any], env_id: str) -> CheckedAgentEnv:
    """`factory()`, which must make a PettingZoo ParallelEnv or AECEnv; EnvError, naming `env_id`, if it raises
    or makes something else (a gymnasium env, an env without `possible_agents`)."""
    env = _made(factory, env_id)
    if not is_multi_agent_env(env):
        if isinstance(env, gym.Env):
            what = "a gymnasium env, not a PettingZoo ParallelEnv or AECEnv, but [multi_agent] is set"
        elif callable(getattr(env, "observation_space", None)) and hasattr(env, "reset"):
            what = (
                f"{type(env).__name__} has no possible_agents: rlgate declares every agent the env can have, with "
                "its spaces, when a session opens (PettingZoo's possible_agents), so it needs them up front"
            )
        else:
            what = f"made {type(env).__name__!r}, which is not a PettingZoo ParallelEnv or AECEnv"
        raise EnvError(f"env {env_id}: {what}")
    return CheckedAgentEnv(env, env_id)


class CheckedAgentEnv:
    """A PettingZoo env whose failures say which env and method failed, as CheckedEnv's do: its own exceptions,
    a ParallelEnv's results that are not PettingZoo's (reset: (observations, infos), step: five dicts by agent),
    and rewards that are not numbers. Observations are the server's to check (it names the agent). Everything
    else is the env's own: its attributes (`agents`, `agent_selection`, the space methods) are forwarded."""

    def __init__(self, env: Any, env_id: str) -> None:
        self.env = env
        self.env_id = env_id
        self._aec = is_aec(env)

    def __getattr__(self, name: str) -> Any:  # only for names this class does not have
        if name == "env":  # not set yet (a copy being built): no endless recursion through self.env
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        # Options only where given: an env whose reset() takes no options (PettingZoo's older API) still resets.
        result = self._call("reset", seed=seed, **({} if options is None else {"options": options}))
        if not self._aec and not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Mapping)):
            self._not_pettingzoos("reset", result, "(observations, infos)")
        return result

    def step(self, actions: Any) -> Any:
        result = self._call("step", actions)
        if self._aec:
            return result
        if not (isinstance(result, tuple) and len(result) == 5 and all(isinstance(x, Mapping) for x in result)):
            self._not_pettingzoos("step", result, "(observations, rewards, terminations, truncations, infos)")
        self._check_rewards("step", result[1])
        return result

    def last(self, observe: bool = True) -> Any:
        result = self._call("last", observe)
        if isinstance(result, tuple) and len(result) == 5:
            self._check_rewards("last", {self.env.agent_selection: result[1]})
        return result

    def observe(self, agent: str) -> Any:
        return self._call("observe", agent)

    def close(self) -> None:
        self.env.close()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.env, method)(*args, **kwargs)
        except Exception as exc:
            raise EnvError(f"env {self.env_id}: {_raised(method, exc)}") from exc

    def _not_pettingzoos(self, method: str, result: Any, expected: str) -> NoReturn:
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise EnvError(f"env {self.env_id}: {method}() returned {got}, not PettingZoo's {expected}")

    def _check_rewards(self, method: str, rewards: Mapping) -> None:
        for agent, reward in rewards.items():
            if (misfit := _reward_misfit(reward)) is not None:
                raise EnvError(f"env {self.env_id}: {method}() returned, for agent {agent!r}, {misfit}")


def env_spaces(spec: EnvSpec, imports: ImportPolicy) -> tuple[gym.Space, gym.Space]:
    """The observation and action space of one env (made once and closed)."""
    env = checked_env(env_factory(spec, imports), spec.id)
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
    env = checked_agent_env(env_factory(spec, imports), spec.id)
    try:
        return {agent: (env.observation_space(agent), env.action_space(agent)) for agent in env.possible_agents}
    finally:
        env.close()


# Env ids whose package registers them when imported, by prefix: the module, and the rlgate extra that installs it.
# gymnasium 1.x loads no plugins, so `gym.make("ALE/Pong-v5")` alone finds no ALE; rlgate imports the module for
# such an id itself, as it does its own code (the id names no code: the spec needs no --allow-import for it).
REGISTERING_MODULES = {"ALE/": ("ale_py", "atari"), "MiniGrid-": ("minigrid", "minigrid")}


def register_env_id(env_id: str) -> None:
    """Import the package that registers `env_id` (ALE/..., MiniGrid-...), if it is one of those; a package not
    installed is a SpecError saying which extra installs it."""
    for prefix, (module, extra) in REGISTERING_MODULES.items():
        if env_id.startswith(prefix) and env_id not in gym.registry:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise SpecError(f"env.id: {env_id} needs {module}: pip install 'rlgate[{extra}]' ({exc})") from None


def _make_registered(env_id: str, kwargs: dict) -> gym.Env:
    register_env_id(env_id)
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as exc:
        raise SpecError(f"env.id: {exc}") from exc
