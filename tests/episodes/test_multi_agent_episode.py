"""MultiAgentEpisode against RLlib 2.60, and against what a scripted env emitted.

The reference values in data/rllib_multi_agent_episode.json are RLlib 2.60's MultiAgentEpisode answers on
the scripted traces of tests/support/agent_traces.py (data/make_rllib_reference.py wrote them, running
RLlib in a scratch venv): every getter, in list and numpy storage, by env steps and agent steps.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.agent_traces import per_agent, replay, summary, trace

from rlgate.episodes.multi_agent_episode import MultiAgentEnvError, MultiAgentEpisode

REFERENCE = json.loads((Path(__file__).parent / "data" / "rllib_multi_agent_episode.json").read_text())


@pytest.mark.parametrize("case", sorted(REFERENCE))
def test_matches_rllib_on_scripted_traces(case: str) -> None:
    seed, storage = case.split("-")
    episode = replay(MultiAgentEpisode(), trace(int(seed)))
    if storage == "numpy":
        episode.to_numpy()
    assert summary(episode) == REFERENCE[case]


def test_rewards_between_actions_are_summed_into_the_next_step() -> None:
    """RLlib 2.60 gives agent b, which acted at env step 0 and observed again at env step 3, one step whose
    reward is everything it got meanwhile: 0.5 + 0.25 + 1.0."""
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a": 0, "b": 0})
    episode.add_env_step({"a": 1}, {"a": 0, "b": 0}, {"a": 1.0, "b": 0.5})
    episode.add_env_step({"a": 2}, {"a": 1}, {"a": 1.0, "b": 0.25})
    assert episode.get_actions() == {"a": [0, 1], "b": [0]}  # b's action is hanging
    assert episode.get_rewards() == {"a": [1.0, 1.0], "b": [0.75]}
    episode.add_env_step({"a": 3, "b": 3}, {"a": 2}, {"a": 1.0, "b": 1.0})
    b = episode.agent_episodes["b"]
    assert (b.get_observations(), b.get_actions(), b.get_rewards()) == ([0, 3], [0], [1.75])
    assert episode.env_t_to_agent_t["b"].data == [0, "S", "S", 1]
    assert (len(episode), episode.agent_steps(), episode.get_return()) == (3, 4, 4.75)


def test_terminated_without_observation_repeats_the_last_one() -> None:
    """RLlib 2.60 completes a hanging step of an agent terminated without an observation with a copy of its last
    observation; the episode ends for all when every agent is done."""
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a": 5, "b": 7})
    episode.add_env_step({"a": 6}, {"a": 0, "b": 1}, {"a": 1.0})
    episode.add_env_step({}, {"a": 0}, {"a": 2.0, "b": 3.0}, terminateds={"a": True, "b": True, "__all__": False})
    b = episode.agent_episodes["b"]
    assert (b.get_observations(), b.get_actions(), b.get_rewards(), b.is_terminated) == ([7, 7], [1], [3.0], True)
    assert episode.is_terminated and episode.get_terminateds() == {"a": True, "b": True, "__all__": True}


@pytest.mark.parametrize("truncated_all", [False, True])
def test_agents_keep_their_own_flags_when_the_last_ones_leave(truncated_all: bool) -> None:
    """Multi-agent CartPole: a's pole falls, b reaches its time limit, in the same step. b stays truncated and
    not terminated (RLlib 2.60 marks it terminated too, and PPO would then not bootstrap its value), whether
    or not the env says `"__all__"` truncated; the episode is over either way. `"__all__"`'s flags are added
    to each agent's own (RLlib's rule), so a is truncated too where the env says all are."""
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a": 0, "b": 0})
    episode.add_env_step(
        {"a": 1, "b": 1},
        {"a": 0, "b": 0},
        {"a": 1.0, "b": 1.0},
        terminateds={"a": True, "b": False, "__all__": False},
        truncateds={"a": False, "b": True, "__all__": truncated_all},
    )
    a, b = episode.agent_episodes["a"], episode.agent_episodes["b"]
    assert (a.is_terminated, a.is_truncated) == (True, truncated_all)
    assert (b.is_terminated, b.is_truncated) == (False, True)
    assert episode.is_done and episode.is_truncated == truncated_all


def test_an_agent_that_first_observes_as_the_last_ones_leave_never_joins() -> None:
    """The episode ends in this step (every agent that was in it is done): a newcomer is not part of it and gets
    no action (RLlib: it ends terminated with the others, which forgets an agent that never acted)."""
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a": 0})
    episode.add_env_step(
        {"a": 1, "b": 5}, {"a": 0}, {"a": 1.0}, terminateds={"a": True, "__all__": False}, truncateds={"__all__": False}
    )
    assert episode.is_done and set(episode.agent_episodes) == {"a"} and episode.get_agents_to_act() == set()


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (({"a": 1}, {"a": 0}, {}), "got no reward"),
        (({}, {"a": 0}, {}, None), "truncated without a last observation"),
    ],
)
def test_steps_that_break_the_rules_name_the_agent(step: tuple, message: str) -> None:
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a": 0, "b": 0})
    kwargs = {"truncateds": {"a": True, "__all__": False}} if len(step) == 4 else {}
    with pytest.raises(MultiAgentEnvError, match=f"agent 'a'.*{message}"):
        episode.add_env_step(*step[:3], **kwargs)


def test_done_agent_that_gets_data_again_is_an_error() -> None:
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations={"a": 0, "b": 0})
    episode.add_env_step({"a": 1, "b": 1}, {"a": 0, "b": 0}, {"a": 0.0, "b": 0.0}, terminateds={"a": True})
    with pytest.raises(MultiAgentEnvError, match="agent 'a' is done"):
        episode.add_env_step({"a": 2, "b": 2}, {"b": 0}, {"a": 0.0, "b": 0.0})


def test_modules_are_mapped_once_per_agent() -> None:
    calls = []

    def mapping(agent_id: str, episode: MultiAgentEpisode) -> str:
        calls.append(agent_id)
        return f"m_{agent_id}"

    episode = MultiAgentEpisode(agent_to_module_mapping_fn=mapping)
    episode.add_env_reset(observations={"a": 0})
    episode.add_env_step({"a": 1, "b": 0}, {"a": 0}, {"a": 0.0})
    episode.add_env_step({"a": 2, "b": 1}, {"a": 0, "b": 0}, {"a": 0.0, "b": 0.0})
    assert {a: e.module_id for a, e in episode.agent_episodes.items()} == {"a": "m_a", "b": "m_b"}
    assert calls == ["a", "b"]
    assert MultiAgentEpisode().module_for("x") == "default_policy"


def test_state_round_trip() -> None:
    episode = replay(MultiAgentEpisode(), trace(3))
    again = MultiAgentEpisode.from_state(episode.get_state())
    assert summary(again) == summary(episode)


def test_slice_keeps_each_agents_steps_inside_it() -> None:
    """RLlib 2.60's slice docstring example: a0 observes at env steps 0, 3, 4; a1 at 0..3. episode[1:3] holds
    a0's observation 3 and a1's 1, 2, 3; episode[:2] leaves a0's first action hanging, with its reward."""
    episode = MultiAgentEpisode()
    observations = [{"a0": 0, "a1": 0}, {"a1": 1}, {"a1": 2}, {"a0": 3, "a1": 3}, {"a0": 4}]
    episode.add_env_reset(observations=observations[0])
    for before, after in itertools.pairwise(observations):
        episode.add_env_step(after, before, {a: r / 10 + 0.1 for a, r in after.items()})
    part = episode[1:3]
    a0, a1 = part.agent_episodes["a0"], part.agent_episodes["a1"]
    assert (a0.get_observations(), a1.get_observations()) == ([3], [1, 2, 3])
    assert (a0.get_actions(), a1.get_actions()) == ([], [1, 2])
    assert a1.get_rewards() == pytest.approx([0.3, 0.4])  # here each reward comes with the next observation
    assert not (a0.is_done or a1.is_done)
    start = episode[:2]
    assert (start.agent_episodes["a0"].get_observations(), start.agent_episodes["a0"].get_actions()) == ([0], [])
    assert start._hanging_actions_end["a0"] == 0
    assert start._hanging_rewards_end["a0"] == pytest.approx(0.4)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n_agents=st.integers(1, 4), cuts=st.sets(st.integers(1, 15), max_size=4))
def test_chunks_hold_exactly_what_the_env_emitted(seed: int, n_agents: int, cuts: set[int]) -> None:
    """Agents join mid-episode and leave early; the episode is cut into chunks at random env steps (as the
    server ships it). Concatenating each agent's chunks gives exactly its observations, actions and rewards,
    each reward summed into the agent's next step, rewards before its first observation left out."""
    records = trace(seed, n_agents=n_agents, steps=16)
    expected = per_agent(records)
    episode, chunks = MultiAgentEpisode(), []
    for env_step, record in enumerate(records):
        replay(episode, [record])
        if env_step in cuts and not episode.is_done:
            chunks.append(episode)
            episode = episode.cut(len_lookback_buffer=1)
    chunks.append(episode)
    got: dict[str, list] = {}
    for chunk in chunks:
        for agent_id, sa in chunk.agent_episodes.items():
            obs, actions, rewards = got.setdefault(agent_id, [[], [], []])
            observations = list(sa.get_observations())
            obs.extend(observations if not obs else observations[1:])
            actions.extend(sa.get_actions())
            rewards.extend(sa.get_rewards())
    assert {a: [o, x, list(np.round(r, 6))] for a, (o, x, r) in got.items()} == expected
    whole = replay(MultiAgentEpisode(), records)
    assert sum(len(c) for c in chunks) == len(whole)
    assert sum(c.agent_steps() for c in chunks) == whole.agent_steps()


@pytest.mark.parametrize(
    "later",
    [
        [({"a": 2.0}, {"a": 1}, {"a": 1.0, "c": 0.5}, {"c": True})],  # c leaves without ever observing
        [({"a": 2.0, "c": 5.0}, {"a": 1}, {"a": 1.0, "c": 0.5}, {}), ({"a": 3.0, "c": 6.0}, {"a": 2, "c": 0}, {}, {})],
        [({"a": 2.0}, {"a": 1}, {"a": 1.0, "c": 0.5}, {})],  # c still has not observed
    ],
    ids=["leaves", "joins", "waits"],
)
def test_concat_holds_the_rewards_before_a_first_observation_as_the_uncut_episode(later: list) -> None:
    """c gets 0.25 before it ever observes, then the episode is cut. Whatever c does in the successor (leaves
    unobserved, which clears the reward; joins; gets more), the concatenated chunks hold c's pre-observation
    rewards as the uncut episode does, and so the same return with hanging rewards. RLlib 2.60 keeps the first
    chunk's 0.25 in all three (a return 0.25 too high where c leaves)."""

    def play(episode: MultiAgentEpisode, steps: list) -> None:
        for obs, actions, rewards, terminateds in steps:
            episode.add_env_step(
                obs, actions, rewards | {a: 1.0 for a in obs if a not in rewards}, terminateds=terminateds
            )

    first = [({"a": 1.0}, {"a": 0}, {"a": 1.0, "c": 0.25}, {})]
    uncut = MultiAgentEpisode()
    uncut.add_env_reset(observations={"a": 0.0})
    play(uncut, first + later)
    joined = MultiAgentEpisode(uncut.id_)
    joined.add_env_reset(observations={"a": 0.0})
    play(joined, first)
    successor = joined.cut()
    play(successor, later)
    joined.concat_episode(successor)
    assert dict(joined._hanging_rewards_begin) == dict(uncut._hanging_rewards_begin)
    assert joined.get_return(include_hanging_rewards=True) == uncut.get_return(include_hanging_rewards=True)
    assert summary(joined) == summary(uncut)


@pytest.mark.parametrize("cut_at", [1, 4])
def test_concat_of_two_chunks_is_the_uncut_episode(cut_at: int) -> None:
    """Trace 0 with 3 agents, cut after env step 1 (a0's and a1's first actions hang across the cut, so their
    first chunk has no extra model outputs yet; a2 joins with no reward) or 4 (a0 terminates there). The two chunks
    concatenated answer every getter as the uncut episode: the done agent's mapping covers the second chunk's env
    steps, a2's pre-observation record is gone once it is done, a0's and a1's logp columns start in the chunk."""
    records = trace(0, n_agents=3, steps=16)
    uncut = replay(MultiAgentEpisode("e"), records)
    first = replay(MultiAgentEpisode("e"), records[: cut_at + 1])
    first.concat_episode(replay(first.cut(), records[cut_at + 1 :]))
    assert summary(first) == summary(uncut)
    assert dict(first._hanging_rewards_begin) == dict(uncut._hanging_rewards_begin)
