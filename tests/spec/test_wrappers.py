"""Env wrappers in the run spec: applied in order wherever the env is made (so every process sees the wrapped
env's spaces), gymnasium's by name and the user's by import path under the operator's ImportPolicy, and each
failure named with its wrapper."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from support.servers import shipped, target

from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.spec.env import REGISTERING_MODULES, EnvError, env_spaces, make_env
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.run import EnvSpec, RunSpec

SUPPORT = ImportPolicy(["support"])


def cartpole(*wrappers: object, num_envs: int = 1) -> EnvSpec:
    return EnvSpec.model_validate({"id": "CartPole-v1", "wrappers": list(wrappers), "num_envs": num_envs})


def test_wrappers_apply_in_order_with_their_kwargs() -> None:
    # TimeAwareObservation appends the step (4 -> 5 values); Scale, after it, scales all 5: the order shows.
    spec = cartpole("TimeAwareObservation", {"type": "support.wrappers:Scale", "factor": 2.0})
    observation_space, action_space = env_spaces(spec, SUPPORT)
    assert observation_space.shape == (5,) and action_space == gym.spaces.Discrete(2)
    env = make_env(spec, SUPPORT)
    first, _ = env.reset(seed=0)
    second, *_ = env.step(0)
    assert (first[-1], second[-1]) == (0.0, 2.0)  # the time step, scaled
    assert np.abs(second[:4]).max() > 0  # the pole's state, scaled too


def test_a_wrapper_by_import_path_is_imported_only_where_its_module_is_allowed() -> None:
    spec = cartpole({"type": "support.wrappers:Scale", "factor": 2.0})
    with pytest.raises(SpecError, match=r"env.wrappers\[0\]: .* may not import .* --allow-import support"):
        make_env(spec, ImportPolicy())
    run = RunSpec.model_validate({"env": spec.model_dump()})
    assert run.modules() == ["support.wrappers"] and run.policy_modules() == []  # the server never makes the env


@pytest.mark.parametrize(
    ("wrapper", "error", "message"),
    [
        ("NoSuchWrapper", SpecError, "env.wrappers[0]: gymnasium.wrappers has no wrapper 'NoSuchWrapper'"),
        ("support.nosuch:Wrapper", SpecError, "env.wrappers[0]: cannot import 'support.nosuch'"),
        ("support.wrappers:Nope", SpecError, "env.wrappers[0]: module 'support.wrappers' has no 'Nope'"),
        (
            "support.wrappers:NotASpace",
            EnvError,
            "env CartPole-v1, wrapped by env.wrappers[0] (support.wrappers:NotASpace): its observation_space is not "
            "a gymnasium space",
        ),
        (
            "support.wrappers:TextObservations",
            EnvError,
            "env CartPole-v1, wrapped by env.wrappers[0] (support.wrappers:TextObservations): space Text(1, 8,",
        ),
        (
            {"type": "AtariPreprocessing", "frame_skip": 4},
            EnvError,
            "env CartPole-v1, wrapped by env.wrappers[0] (AtariPreprocessing): __init__() raised ",
        ),
    ],
)
def test_a_wrapper_that_does_not_import_or_breaks_the_spaces_is_named(wrapper, error, message) -> None:
    with pytest.raises(error) as raised:
        env_spaces(cartpole(wrapper), SUPPORT)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value), raised.value


def test_observations_outside_a_wrappers_space_name_that_wrapper_not_the_env() -> None:
    env = make_env(cartpole("TimeAwareObservation", "support.wrappers:WrongShape"), SUPPORT)
    with pytest.raises(EnvError) as raised:
        env.reset(seed=0)
    assert str(raised.value).startswith(
        "env CartPole-v1, wrapped by env.wrappers[1] (support.wrappers:WrongShape): reset() returned an observation "
        "of shape (5,), but its observation space is Box(-1.0, 1.0, (3,), float32)"
    )


def test_a_multi_agent_spec_takes_no_gymnasium_wrappers() -> None:
    with pytest.raises(SpecError, match=r"env\.wrappers: gymnasium wrappers take a gymnasium env"):
        RunSpec.parse({"env": {"wrappers": ["TimeAwareObservation"]}, "multi_agent": {}}, "t")


async def test_the_server_serves_the_wrapped_envs_spaces(server_factory, tmp_path) -> None:
    """A server given the spec makes the env for its spaces (wrapped); a client running the spec's env, wrapped
    the same, is served, and its episodes hold the wrapped observations."""
    spec = RunSpec.model_validate({"env": cartpole("TimeAwareObservation", num_envs=2).model_dump(), "seed": 0})
    server = await server_factory(spec=spec)
    client = EnvClient(make_env(spec.env, ImportPolicy()), target(server), seed=0)
    stats = await client.run(max_steps=60)
    assert stats.env_steps >= 60
    await server.stop()
    chunks = shipped(tmp_path / "episodes")
    assert chunks and all(codec.from_value(c.observations).shape[1:] == (5,) for c in chunks)


def test_an_env_id_whose_package_is_missing_says_which_extra_installs_it(monkeypatch) -> None:
    monkeypatch.setitem(REGISTERING_MODULES, "Nope/", ("rlgate_no_such_package", "nope"))
    with pytest.raises(
        SpecError, match=r"^env.id: Nope/Game-v0 needs rlgate_no_such_package: pip install 'rlgate\[nope\]'"
    ):
        env_spaces(EnvSpec(id="Nope/Game-v0"), ImportPolicy())
