"""Cut, slice and concat of MultiAgentEpisodes, each compared with an uncut twin that saw the same env steps.

Random schedules (tests/support/agent_traces.py): agents join late and leave early, act turn by turn or all at
once, get rewards between their actions and before they first observe, and the episode may still be running.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from support.agent_traces import plain, replay, summary, trace

from rlgate.episodes import MultiAgentEpisode

GETTERS = ("observations", "actions", "rewards")


def env_step_view(episode: MultiAgentEpisode, index: int, what: str, agents: set | None = None) -> dict:
    """`get_<what>` at one env-step index (negative: into the lookback), as plain values, of `agents` (all)."""
    got = getattr(episode, f"get_{what}")(index, neg_index_as_lookback=index < 0)
    return plain({a: v for a, v in got.items() if agents is None or a in agents})


def assert_like_twin(part: MultiAgentEpisode, twin: MultiAgentEpisode, start: int) -> None:
    """Every env step of `part` (lookback included) answers as `twin` at env step `start` + index, for the
    agents `part` holds."""
    agents = set(part.agent_episodes)
    lookback = min((m.lookback for m in part.env_t_to_agent_t.values()), default=0)
    for index in range(-lookback, len(part) + 1):
        for what in GETTERS:
            if what != "observations" and index == len(part):
                continue  # the action after the last observation is not taken yet
            expected = env_step_view(twin, start + index, what, agents)
            assert env_step_view(part, index, what) == expected, (what, index, start)


def assert_slices_like_twin(episode: MultiAgentEpisode, twin: MultiAgentEpisode, bounds: list[tuple]) -> None:
    """Slices of `episode` (list and numpy storage) answer as `twin` at the same env steps, and their returns
    with hanging rewards are the twin's rewards of the actions taken in them."""
    n = len(episode)
    for a, b in bounds:
        start, stop = sorted((a % (n + 1), b % (n + 1)))
        part = episode[start:stop]
        assert_like_twin(part, twin, episode.env_t_started + start)
        rewards = [sum(twin.get_rewards(episode.env_t_started + i).values()) for i in range(start, stop)]
        assert math.isclose(part.get_return(include_hanging_rewards=True), sum(rewards), abs_tol=1e-6)
        numpy = episode[start:stop].to_numpy()
        for index in range(len(part)):
            assert all(env_step_view(numpy, index, w) == env_step_view(part, index, w) for w in GETTERS)
        assert numpy._hanging_actions_end == part._hanging_actions_end


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_agents=st.integers(1, 4),
    turn_based=st.booleans(),
    running=st.booleans(),
    cuts=st.dictionaries(st.integers(1, 15), st.integers(0, 4), max_size=4),
    bounds=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=3),
)
def test_cut_slice_and_concat_match_the_uncut_twin(seed, n_agents, turn_based, running, cuts, bounds) -> None:
    """Every chunk (at its cut, and its successor right after, lookback included) and every slice answers at each
    env step as the uncut twin at the same env step; the concatenated chunks are the twin (every getter, the
    mappings, returns with hanging rewards), and so is the episode built from the records as RLlib's lists."""
    records = trace(seed, n_agents=n_agents, steps=16, turn_based=turn_based)
    if running:
        records = records[: max(len(records) - 3, 1)]
    twin = MultiAgentEpisode("twin")
    chunk, chunks = MultiAgentEpisode("twin"), []
    for env_step, record in enumerate(records):
        replay(twin, [record])
        replay(chunk, [record])
        if env_step in cuts and not chunk.is_done:
            assert_like_twin(chunk, twin, chunk.env_t_started)
            assert_slices_like_twin(chunk, twin, bounds)
            chunks.append(chunk)
            chunk = chunk.cut(len_lookback_buffer=cuts[env_step])
            assert_like_twin(chunk, twin, chunk.env_t_started)
    assert_like_twin(chunk, twin, chunk.env_t_started)
    chunks.append(chunk)
    assert_slices_like_twin(twin, twin, bounds)
    joined = chunks[0]
    for successor in chunks[1:]:
        joined.concat_episode(successor)
    assert summary(joined) == summary(twin)
    assert dict(joined._hanging_rewards_begin) == dict(twin._hanging_rewards_begin)
    assert summary(MultiAgentEpisode(**as_lists(records), len_lookback_buffer=0)) == summary(twin)


def as_lists(records: list[tuple]) -> dict:
    """The records as RLlib's per-env-step constructor lists (replay()'s logp included)."""
    steps = records[1:]
    return {
        "observations": [records[0][1]] + [step[1] for step in steps],
        "actions": [step[2] for step in steps],
        "rewards": [step[3] for step in steps],
        "extra_model_outputs": [{a: {"logp": x / 10} for a, x in step[2].items()} for step in steps],
        "terminateds": steps[-1][4] if steps else False,
    }
