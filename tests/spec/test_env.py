"""CheckedEnv: an env's observations that do not fit its observation space, named with the env and method."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from support.bad_envs import Returns

from rlgate.spec.env import EnvError, checked_env

BOX2 = gym.spaces.Box(-1, 1, (2,), np.float32)
NESTED = gym.spaces.Dict({"pos": BOX2, "parts": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.MultiBinary(4)])})


def nested(pos=None, kind=1, bits=None) -> dict:
    return {
        "pos": np.zeros(2, np.float32) if pos is None else pos,
        "parts": (kind, np.zeros(4, np.int8) if bits is None else bits),
    }


@pytest.mark.parametrize(
    ("space", "good", "bad", "what"),
    [
        (gym.spaces.Discrete(3, start=1), np.int64(1), 4, "that is 4, outside Discrete(3, start=1)"),
        (gym.spaces.Discrete(3), 2, 1.0, "that is 1.0, not an integer"),
        (gym.spaces.MultiDiscrete([2, 3]), np.array([1, 2]), np.array([1, 2, 0]), "of shape (3,)"),
        (gym.spaces.MultiBinary(4), np.zeros(4, np.int8), np.zeros((2, 2), np.int8), "of shape (2, 2)"),
        (
            gym.spaces.Dict({"pos": BOX2}),
            {"pos": np.zeros(2)},
            {"p": np.zeros(2)},
            "that is a dict of keys ['p'], not ['pos']",
        ),
        (gym.spaces.Dict({"pos": BOX2}), {"pos": np.zeros(2)}, np.zeros(2), "that is a ndarray, not a dict"),
        (
            gym.spaces.Tuple([BOX2, BOX2]),
            (np.zeros(2),) * 2,
            (np.zeros(2),),
            "that is a tuple of 1, not a tuple of 2",
        ),
        (NESTED, nested(), nested(pos=np.zeros(3)), "whose ['pos'] has shape (3,)"),
        (NESTED, nested(), nested(kind=3), "whose ['parts'][0] is 3, outside Discrete(3)"),
        (NESTED, nested(), nested(bits=np.zeros(5)), "whose ['parts'][1] has shape (5,)"),
    ],
)
def test_an_observation_outside_its_space_is_named_with_env_and_method(space, good, bad, what) -> None:
    for method, env in (("reset", Returns(space, bad, good)), ("step", Returns(space, good, bad))):
        checked = checked_env(lambda env=env: env, "my.envs:Env")
        with pytest.raises(EnvError) as raised:
            checked.reset(seed=0)
            checked.step(0)
        message = str(raised.value)
        assert message.startswith(f"env my.envs:Env: {method}() returned an observation {what}, but its "), message
        assert message.endswith(f"observation space is {space}") and "\n" not in message


def test_observations_that_fit_pass_unchanged() -> None:
    env = checked_env(lambda: Returns(NESTED, nested(), nested(kind=np.int64(2))), "x")
    assert env.reset(seed=0)[0]["parts"][0] == 1
    assert env.step(0)[0]["parts"][0] == 2


@pytest.mark.parametrize(
    ("space", "observation"),
    [
        (gym.spaces.Tuple([gym.spaces.Discrete(3)] * 2), np.array([0, 2])),  # gymnasium's Tuple takes arrays
        (gym.spaces.Tuple([BOX2, BOX2]), [np.zeros(2, np.float32), np.ones(2, np.float32)]),
        (gym.spaces.Discrete(2), np.array(1)),
        (gym.spaces.Discrete(2), True),
        (BOX2, [0.5, -0.5]),
    ],
)
def test_what_gymnasiums_spaces_contain_passes(space, observation) -> None:
    assert space.contains(observation)
    env = checked_env(lambda: Returns(space, observation, observation), "x")
    assert env.step(0)[0] is observation


def test_a_checked_pettingzoo_env_steps_as_the_env_itself() -> None:
    """make_agent_envs' CheckedAgentEnv only watches: a turn-based game (AEC: last(), observe(), dead agents
    stepped with None) and a parallel env give the steps their unwrapped selves give."""
    pytest.importorskip("pettingzoo")
    from pettingzoo.classic import tictactoe_v3
    from support.bad_agent_envs import NoResetOptions, ParallelSteps

    from rlgate.envs.agent_envs import AgentEnvs
    from rlgate.spec.env import checked_agent_env

    def trace(env, seed: int) -> list:
        envs, rng, steps = AgentEnvs([env]), np.random.default_rng(seed), []
        (step,) = envs.reset(seed=seed)
        for _ in range(60):
            legal = {
                agent: np.flatnonzero(o["action_mask"]) if isinstance(o, dict) else [0, 1]
                for agent, o in step.observations.items()
            }  # a finished game's masks are empty: unused
            actions = {agent: rng.choice(moves) if len(moves) else 0 for agent, moves in legal.items()}
            (step,) = envs.step([actions])
            steps.append((step.rewards, step.terminateds, step.truncateds, sorted(step.observations)))
        return steps

    for make in (tictactoe_v3.env, ParallelSteps, NoResetOptions):
        checked = checked_agent_env(make, "x")
        assert type(checked).__name__ == "CheckedAgentEnv" and checked.possible_agents == make().possible_agents
        assert trace(checked, 3) == trace(make(), 3)
