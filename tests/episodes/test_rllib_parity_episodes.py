"""SingleAgentEpisode and MultiAgentEpisode checked against RLlib 2.60 itself.

The expected values were printed by RLlib 2.60 (`ray[rllib]==2.60.0`, numpy 2.4) running its own
SingleAgentEpisode / MultiAgentEpisode on the same inputs (`episode()` below; the scripted traces of
tests/support/agent_traces.py), in a scratch venv outside the repo (ray is never imported here). Where rlgate
keeps a deliberate difference (see the modules' docstrings), the test says what RLlib did and asserts
rlgate's documented behaviour.
"""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
from support.agent_traces import replay, summary, trace

from rlgate.episodes import MultiAgentEpisode, SingleAgentEpisode

OBS = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)
DICT_OBS = gym.spaces.Dict({"a": gym.spaces.Discrete(4), "b": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})


def episode(numpy: bool, n: int = 8, lookback: int = 3) -> SingleAgentEpisode:
    """Observations [i, -i], actions i % 3, rewards i, infos {"i": i}, logp -i; the first `lookback` steps
    are lookback."""
    built = SingleAgentEpisode(
        "x",
        observations=[np.array([i, -i], np.float32) for i in range(n + 1)],
        observation_space=OBS,
        actions=[i % 3 for i in range(n)],
        action_space=ACT,
        rewards=[float(i) for i in range(n)],
        infos=[{"i": i} for i in range(n + 1)],
        extra_model_outputs={"logp": [np.float32(-i) for i in range(n)]},
        len_lookback_buffer=lookback,
    )
    return built.to_numpy() if numpy else built


def dict_episode(numpy: bool) -> SingleAgentEpisode:
    """5 steps of Dict observations {"a": i % 4, "b": [i / 10, -i / 10]}, 2 of them lookback."""
    built = SingleAgentEpisode(
        "d",
        observations=[{"a": i % 4, "b": np.array([i / 10, -i / 10], np.float32)} for i in range(6)],
        observation_space=DICT_OBS,
        actions=[0] * 5,
        action_space=ACT,
        rewards=[1.0] * 5,
        len_lookback_buffer=2,
    )
    return built.to_numpy() if numpy else built


def plain(x):
    """Nested arrays as lists, for comparing with RLlib's printed values."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    return np.asarray(x).tolist()


@pytest.mark.parametrize("numpy", [False, True])
def test_single_agent_getters_answer_as_rllib(numpy):
    """RLlib's answers (list and numpy mode alike) on the 8-step episode with 3 lookback steps."""
    e, d = episode(numpy), dict_episode(numpy)
    assert (len(e), e.t_started, e.t, e.get_return()) == (5, 0, 5, 25.0)
    assert plain(e.get_observations(-2, neg_index_as_lookback=True)) == [1.0, -1.0]
    assert plain(e.get_observations(slice(-2, 3), neg_index_as_lookback=True, fill=-7)) == [
        [1.0, -1.0],
        [2.0, -2.0],
        [3.0, -3.0],
        [4.0, -4.0],
        [5.0, -5.0],
    ]
    assert plain(e.get_observations(slice(-12, 2), fill=-7)) == [[-7.0, -7.0]] * 3 + [
        [0.0, 0.0],
        [1.0, -1.0],
        [2.0, -2.0],
        [3.0, -3.0],
        [4.0, -4.0],
    ]
    assert plain(e.get_actions([-1, -3], neg_index_as_lookback=True)) == [2, 0]
    assert plain(e.get_actions(slice(-2, 3), neg_index_as_lookback=True, fill=-7, one_hot_discrete=True)) == [
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 1.0],
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 1.0],
    ]
    assert plain(e.get_rewards(slice(5, 12), neg_index_as_lookback=True, fill=-7)) == [-7.0] * 7
    assert plain(e.get_extra_model_outputs("logp", slice(-3, None))) == [-5.0, -6.0, -7.0]
    assert e.get_infos([0, 9], fill=-7) == [{"i": 3}, -7]
    with pytest.raises(IndexError):
        e.get_rewards(-9)
    one_hot = d.get_observations(slice(-3, -1), neg_index_as_lookback=True, fill=-7, one_hot_discrete=True)
    rows = one_hot if isinstance(one_hot, list) else [{k: v[i] for k, v in one_hot.items()} for i in range(2)]
    assert plain(rows) == [{"a": [-7.0] * 4, "b": [-7.0, -7.0]}, {"a": [1.0, 0.0, 0.0, 0.0], "b": [0.0, 0.0]}]


@pytest.mark.parametrize("numpy", [False, True])
def test_single_agent_cut_and_slice_as_rllib(numpy):
    """RLlib: cut(len_lookback_buffer=2) starts at t=5 with steps 6 and 7 as lookback; slice(2, 5) with
    len_lookback_buffer=1 has t_started 2, t 5, one lookback step (observations 4..8, actions 1 2 0 1)."""
    successor = episode(numpy).cut(len_lookback_buffer=2)
    assert (len(successor), successor.t_started, successor.t, successor.observations.lookback) == (0, 5, 5, 2)
    assert plain(successor.observations.data) == [[6.0, -6.0], [7.0, -7.0], [8.0, -8.0]]
    assert plain(successor.actions.data) == [0, 1] and plain(successor.rewards.data) == [6.0, 7.0]
    sliced = episode(numpy).slice(slice(2, 5), len_lookback_buffer=1)
    assert (len(sliced), sliced.t_started, sliced.t, sliced.get_return()) == (3, 2, 5, 18.0)
    assert {b.lookback for b in (sliced.observations, sliced.actions, sliced.rewards, sliced.infos)} == {1}
    assert plain(sliced.observations.data) == [[4.0, -4.0], [5.0, -5.0], [6.0, -6.0], [7.0, -7.0], [8.0, -8.0]]
    assert plain(sliced.actions.data) == [1, 2, 0, 1]


def test_to_numpy_of_a_zero_length_episode_converts_every_column():
    """RLlib's to_numpy() converts only the observations of a length-0 episode (all its data lookback): its
    actions, rewards and extra model outputs stay lists and is_numpy stays False. Here (a deliberate
    difference) every column is converted, as for any other episode."""
    e = episode(numpy=False, n=3, lookback=10).to_numpy()
    assert len(e) == 0 and e.observations.lookback == 3
    assert e.is_numpy
    assert isinstance(e.actions.data, np.ndarray) and isinstance(e.extra_model_outputs["logp"].data, np.ndarray)


def cut_trace(len_lookback_buffer: int) -> MultiAgentEpisode:
    """Trace 2 (a0 from the reset; a1 and a2 join later) cut after 2 env steps, the successor replaying the rest:
    a1 first observes at the successor's env step 2, a2 at its step 8."""
    records = trace(2)
    successor = replay(MultiAgentEpisode(), records[:3]).cut(len_lookback_buffer=len_lookback_buffer)
    return replay(successor, records[3:])


def test_an_agent_new_to_a_chunk_is_absent_in_its_lookback_as_in_rllib():
    """RLlib, the successor cut with len_lookback_buffer=2: a1's and a2's env-step mappings hold skip tags over
    the lookback too (lookback 2), so an index there finds them absent: get_observations(-1,
    neg_index_as_lookback=True) == {} and [-1, -2] gives {"a0": [1.0]}."""
    e = cut_trace(2)
    mappings = {agent: (list(m.data), m.lookback) for agent, m in e.env_t_to_agent_t.items()}
    assert mappings == {
        "a0": ([0, "S", 1, 2, 3, "S", "S", 4, "S", 5, "S", 6, 7], 2),
        "a1": (["S", "S", "S", "S", 0, "S", 1, "S", "S", 2, 3, "S", 4], 2),
        "a2": (["S"] * 10 + [0, "S", 1], 2),
    }
    assert e.get_observations(-1, neg_index_as_lookback=True) == {}
    assert e.get_observations([-1, -2], neg_index_as_lookback=True) == {"a0": [1.0]}
    assert e.get_observations(2) == {"a0": 3.0, "a1": 8.0}


def test_an_agent_new_to_a_chunk_is_mapped_from_the_chunk_start():
    """RLlib, the successor cut with len_lookback_buffer=0: a1's mapping is ["S"] * 4 + [0, ...] (skip tags for
    every env step since the reset, env_t 4, not since the chunk's start, env_t_started 2), so its first
    observation lands at the chunk's env step 4 instead of 2: get_observations(2) == {"a0": 3.0} and a1's
    fill=-5.0 row has 13 entries where the chunk has 11 (its env steps 0 to 10). Here (a deliberate difference) a1 is at
    env step 2, as when the lookback is 2 (where RLlib's count happens to fit)."""
    e = cut_trace(0)
    assert [list(m.data) for m in (e.env_t_to_agent_t["a1"], e.env_t_to_agent_t["a2"])] == [
        ["S", "S", 0, "S", 1, "S", "S", 2, 3, "S", 4],
        ["S"] * 8 + [0, "S", 1],
    ]
    assert e.get_observations(2) == {"a0": 3.0, "a1": 8.0}
    rows = e.get_observations(fill=-5.0)
    assert rows["a1"] == [-5.0, -5.0, 8.0, -5.0, 6.0, -5.0, -5.0, 8.0, 5.0, -5.0, 3.0]
    assert {len(row) for row in rows.values()} == {len(e) + 1}


def turns(n_observations: int) -> MultiAgentEpisode:
    """RLlib's slice docstring episode, continued: a0 observes at env steps 0, 3 (and 5), a1 at every step; each
    action is the observation it follows, logp its -1/10; an observation brings reward obs / 10 + 0.1, a0's env
    steps without one 0.05."""
    observations = [{"a0": 0, "a1": 0}, {"a1": 1}, {"a1": 2}, {"a0": 3, "a1": 3}, {"a1": 4}, {"a0": 5, "a1": 5}]
    e = MultiAgentEpisode()
    e.add_env_reset(observations=observations[0])
    for before, after in itertools.pairwise(observations[:n_observations]):
        rewards = {a: o / 10 + 0.1 for a, o in after.items()} | ({} if "a0" in after else {"a0": 0.05})
        e.add_env_step(after, before, rewards, extra_model_outputs={a: {"logp": -o / 10} for a, o in before.items()})
    return e


def hanging(e: MultiAgentEpisode) -> dict:
    return {
        a: (int(x), round(e._hanging_rewards_end[a], 5), float(e._hanging_extra_model_outputs_end[a]["logp"]))
        for a, x in e._hanging_actions_end.items()
    }


@pytest.mark.parametrize("numpy", [False, True])
def test_slice_hangs_only_the_actions_taken_inside_it_as_rllib(numpy):
    """RLlib, the 6-observation episode: in [0:3] and [1:3] a0's last observation is at env step 3, the slice's
    end, so the action it takes there (3) belongs to env step 4 and nothing hangs (a0 holds observations [0, 3] /
    [3], action [0] / []); [3:4] and [0:2] end before a0 observes again, so its action there hangs with the step's
    reward (3, 0.65; 0, 0.5). Numpy mode (and to_numpy() of a slice) alike."""
    e = turns(6).to_numpy() if numpy else turns(6)
    for part, obs, actions, hangs in [
        (e[0:3], [0, 3], [0], {}),
        (e[1:3], [3], [], {}),
        (e[3:4], [3], [], {"a0": (3, 0.65, -0.3)}),
        (e[0:2], [0], [], {"a0": (0, 0.5, -0.0)}),
    ]:
        a0 = part.to_numpy().agent_episodes["a0"]
        assert (plain(a0.get_observations()), plain(a0.get_actions()), hanging(part)) == (obs, actions, hangs)


@pytest.mark.parametrize("numpy", [False, True])
def test_slice_to_the_end_keeps_the_actions_that_still_hang_as_rllib(numpy):
    """RLlib, the 5-observation episode (a0 acted 3 at env step 3 and has not observed since): [3:], [-2:],
    [2:4] and [0:] keep a0's hanging action with its reward so far (0.05) and logp; a0 is not done in any."""
    e = turns(5).to_numpy() if numpy else turns(5)
    for part, a1 in [(e[3:], [3, 4]), (e[-2:], [2, 3, 4]), (e[2:4], [2, 3, 4]), (e[0:], [0, 1, 2, 3, 4])]:
        assert hanging(part.to_numpy()) == {"a0": (3, 0.05, -0.3)}
        assert plain(part.agent_episodes["a1"].get_observations()) == a1
        assert not part.agent_episodes["a0"].is_done and not part.is_done


def hanging_b() -> MultiAgentEpisode:
    """a observes at env steps 0..3; b at 0 and 1, then acts (1) at env step 1 and waits: its action hangs."""
    e = MultiAgentEpisode()
    e.add_env_reset(observations={"a": 0.0, "b": 0.0})
    e.add_env_step({"a": 1.0, "b": 1.0}, {"a": 0, "b": 0}, {"a": 1.0, "b": 1.0})
    e.add_env_step({"a": 2.0}, {"a": 1, "b": 1}, {"a": 1.0, "b": 0.5})
    e.add_env_step({"a": 3.0}, {"a": 2}, {"a": 1.0, "b": 0.25})
    return e


@pytest.mark.parametrize("len_lookback_buffer", [0, 1, 2])
def test_cut_lookback_reaches_the_last_observation_of_an_agent_whose_action_hangs(len_lookback_buffer):
    """RLlib, cut(len_lookback_buffer=1) or 2: the env-step lookback grows to 2, back to b's last observation (env
    step 1): mappings a [1, 2, 3] and b [1, "S", "S"] (lookback 2), a's agent episode observations 1..3 with
    lookback 2, b's [1.0] (its pending step, t_started 1), get_observations(-2, neg_index_as_lookback=True) ==
    {"a": 1.0, "b": 1.0}; b's step completes in the successor (reward 0.5 + 0.25 + 1.0). RLlib's cut(0) extends
    only when the agent's first mapping entry is a skip tag (its loop starts reading at index -0, the first
    entry), so here it drops b's pending step; rlgate extends for every lookback length."""
    successor = hanging_b().cut(len_lookback_buffer=len_lookback_buffer)
    mappings = {agent: (list(m.data), m.lookback) for agent, m in successor.env_t_to_agent_t.items()}
    assert mappings == {"a": ([1, 2, 3], 2), "b": ([1, "S", "S"], 2)}
    a, b = successor.agent_episodes["a"], successor.agent_episodes["b"]
    assert (a.get_observations(slice(-2, None), neg_index_as_lookback=True), a.t_started) == ([1.0, 2.0, 3.0], 3)
    assert (b.get_observations(), b.t_started) == ([1.0], 1)
    assert successor.get_observations(-1, neg_index_as_lookback=True) == {"a": 2.0}
    assert successor.get_observations(-2, neg_index_as_lookback=True) == {"a": 1.0, "b": 1.0}
    successor.add_env_step({"a": 4.0, "b": 4.0}, {"a": 3}, {"a": 1.0, "b": 1.0})
    assert (b.get_observations(), b.get_actions(), b.get_rewards()) == ([1.0, 4.0], [1], [1.75])


def docstring_lists() -> dict:
    """RLlib's MultiAgentEpisode.slice docstring episode as the constructor's lists (rewards one per observation)."""
    observations = [{"a0": 0, "a1": 0}, {"a1": 1}, {"a1": 2}, {"a0": 3, "a1": 3}, {"a0": 4}]
    rewards = [{a: o / 10 + 0.1 for a, o in step.items()} for step in observations]
    return {"observations": observations, "actions": observations[:-1], "rewards": rewards}


def test_constructor_takes_rllib_per_env_step_lists_as_its_slice_docstring():
    """RLlib's docstring: episode[1:3] holds a0's observation 3 and a1's 1, 2, 3 (actions [] and [1, 2], rewards
    [] and [0.2, 0.3]); episode[:2] leaves a0's action 0 hanging with reward 0.1. a1's action 3 hangs at the end
    (reward 0.4). RLlib counts env_t from the rewards (5 here, one per observation); rlgate from the observations
    (4 env steps after the reset)."""
    e = MultiAgentEpisode(**docstring_lists(), len_lookback_buffer=0)
    assert (len(e), e.get_agents_to_act()) == (4, {"a0"})
    assert (e._hanging_actions_end, e._hanging_rewards_end["a1"]) == ({"a1": 3}, pytest.approx(0.4))
    part = e[1:3]
    a0, a1 = part.agent_episodes["a0"], part.agent_episodes["a1"]
    assert (a0.get_observations(), a1.get_observations()) == ([3], [1, 2, 3])
    assert (a0.get_actions(), a1.get_actions()) == ([], [1, 2])
    assert (a0.get_rewards(), a1.get_rewards()) == ([], pytest.approx([0.2, 0.3]))
    start = e[:2]
    assert (start._hanging_actions_end, start._hanging_rewards_end["a0"]) == ({"a0": 0}, pytest.approx(0.1))


def joining_lists() -> dict:
    """a observes at every env step; b at 0, 1 and 4 (its action at 1 hangs over 2 and 3); c joins at 2 and acts
    7 there; rewards between the agents' steps; logp -action / 10; infos {"i": env step}."""
    observations = [{"a": 0.0, "b": 0.0}, {"a": 1.0, "b": 1.0}, {"a": 2.0, "c": 5.0}, {"a": 3.0}]
    observations.append({"a": 4.0, "b": 4.0, "c": 6.0})
    actions = [{"a": 0, "b": 0}, {"a": 1, "b": 1}, {"a": 2, "c": 7}, {"a": 3}]
    rewards = [{"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 0.25, "c": 2.0}, {"a": 1.0, "b": 1.0}]
    return {
        "observations": observations,
        "actions": actions,
        "rewards": rewards,
        "extra_model_outputs": [{a: {"logp": -x / 10} for a, x in step.items()} for step in actions],
        "infos": [{a: {"i": i} for a in step} for i, step in enumerate(observations)],
    }


def test_constructor_maps_each_agents_steps_as_rllib():
    """RLlib, len_lookback_buffer=0, env_t_started=10, agent_t_started {a: 7, b: 3, c: 1}: len 4 (env_t 14),
    mappings a [7..11], b [3, 4, "S", "S", 5], c ["S", "S", 1, "S", 2]; b's step sums 0.5 + 0.25 + 1.0; every
    agent observed last, so all act next."""
    e = MultiAgentEpisode(
        **joining_lists(), env_t_started=10, agent_t_started={"a": 7, "b": 3, "c": 1}, len_lookback_buffer=0
    )
    assert (len(e), e.env_t_started, e.env_t, e.get_agents_to_act()) == (4, 10, 14, {"a", "b", "c"})
    assert {a: list(m.data) for a, m in e.env_t_to_agent_t.items()} == {
        "a": [7, 8, 9, 10, 11],
        "b": [3, 4, "S", "S", 5],
        "c": ["S", "S", 1, "S", 2],
    }
    b, c = e.agent_episodes["b"], e.agent_episodes["c"]
    assert (b.get_observations(), b.get_actions(), b.get_rewards(), b.t_started, b.t) == (
        [0.0, 1.0, 4.0],
        [0, 1],
        [1.0, 1.75],
        3,
        5,
    )
    assert (c.get_actions(), c.get_rewards(), plain(c.get_extra_model_outputs("logp"))) == ([7], [2.0], [-0.7])
    assert e.get_infos(2) == {"a": {"i": 2}, "c": {"i": 2}} and e.get_return() == 8.75


def env_steps(lists: dict, first: int, last: int) -> dict:
    """The lists of env steps first..last (observations and infos) and the actions between them."""
    return {k: v[first : last + (k in ("observations", "infos"))] for k, v in lists.items()}


def test_constructor_lookback_holds_the_steps_that_complete_in_it_as_the_cut_successor():
    """Env steps 1..3 with len_lookback_buffer=2 (env steps 1 and 2 are lookback, the chunk starts at env step 3)
    build what cut(len_lookback_buffer=2) after env step 3 builds, before and after env step 4: a's steps 1->2
    and 2->3 are lookback, b's last observation (1) starts its pending step (t_started 1, no lookback), so the
    step completes in this chunk. RLlib's constructor puts a step that straddles the chunk's start in the
    lookback (b lookback 1), where neither chunk of a cut episode holds it: a deliberate difference."""
    lists = joining_lists()
    cut = MultiAgentEpisode(**env_steps(lists, 0, 3), len_lookback_buffer=0).cut(len_lookback_buffer=2)
    listed = MultiAgentEpisode(
        **env_steps(lists, 1, 3), env_t_started=3, agent_t_started={"a": 3, "b": 1, "c": 0}, len_lookback_buffer=2
    )
    assert summary(listed) == summary(cut)
    b = listed.agent_episodes["b"]
    assert (b.get_observations(), b.t_started, b.observations.lookback, listed._hanging_actions_end) == (
        [1.0],
        1,
        0,
        {"b": 1, "c": 7},
    )
    for episode in (listed, cut):
        episode.add_env_step(lists["observations"][4], lists["actions"][3], lists["rewards"][3])
    assert summary(listed) == summary(cut)
    assert (b.get_observations(), b.get_rewards()) == ([1.0, 4.0], [1.75])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"observations": [{"a": 0}, {"a": 1}], "actions": []}, "0 actions"),
        ({"observations": [{"a": 0}, {"a": 1}], "actions": [{"a": 0}], "infos": [{}]}, "1 infos"),
        ({"observations": [{"a": 0}, {"a": 1}], "actions": [{"b": 0}]}, "agent 'b' acted before it ever observed"),
        ({"actions": [{"a": 0}]}, "come with observations"),
    ],
)
def test_constructor_refuses_lists_that_do_not_fit(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiAgentEpisode(**kwargs)


@pytest.mark.parametrize("flags", [True, {"__all__": True, "a": True, "b": True}])
def test_constructor_ends_the_episode_with_its_flags(flags):
    """terminateds=True (RLlib raises AttributeError for a bool) or per agent: every agent ends terminated; b,
    whose action hangs, completes its step with its last observation, as add_env_step records it (RLlib's
    constructor leaves its action hanging in the finished episode)."""
    lists = env_steps(joining_lists(), 0, 3)
    e = MultiAgentEpisode(**lists, terminateds=flags, len_lookback_buffer=0)
    assert e.is_terminated and all(a.is_terminated for a in e.agent_episodes.values())
    assert e._hanging_actions_end == {} and e.agent_episodes["b"].get_observations() == [0.0, 1.0, 1.0]
    assert MultiAgentEpisode(terminateds=flags).is_terminated  # RLlib: without lists, the flags are the episode's
