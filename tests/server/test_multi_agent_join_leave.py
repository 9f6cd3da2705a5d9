"""Agents that join mid-episode and leave early (issue 17's property): the chunks a server ships, cut at any
step, flushed at any time and sent through the wire codec, hold for every agent exactly the observations,
actions and rewards the env emitted and received, and as many steps as the agent took.

The env (`JoinLeaveEnv`) plays a random script live against a real policy; the hypothesis test drives one
session in process (client encoding, the server's decoder, session, policy, episode codec) for many scripts,
and a second test runs scripted envs through a real server and client."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agent_traces import JoinLeaveEnv, per_agent
from support.chunks import decoded
from support.servers import shipped, target

from rlgate.client.env_client import EnvClient, _agents_step
from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.envs.agent_envs import AgentEnvs
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.policy.acting import ActingCore
from rlgate.server.agents_step_decoder import AgentsStepDecoder, encode_agent_actions
from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
from rlgate.spec.multi_agent import spaces_by_agent
from rlgate.spec.run import RunSpec
from rlgate.v1 import policy_pb2 as pb


def run_spec(mapping: str, count_steps_by: str, fragment: int | None) -> RunSpec:
    sampling = {"rollout_fragment_length": fragment} if fragment else {"batch_mode": "complete_episodes"}
    multi_agent = {"policy_mapping_fn": mapping, "count_steps_by": count_steps_by}
    return RunSpec.parse({"multi_agent": multi_agent, "sampling": sampling, "seed": 0}, "test")


def assert_chunks_match_the_env(envs: list[JoinLeaveEnv], chunks: list[SingleAgentEpisode]) -> int:
    """Every episode that ended (in order per sub-env) against the env's records; the number compared."""
    episodes: dict[str, dict[str, list[SingleAgentEpisode]]] = {}
    for chunk in sorted(chunks, key=lambda c: c.chunk_index):
        episodes.setdefault(chunk.multi_agent_episode_id, {}).setdefault(chunk.agent_id, []).append(chunk)
    compared = 0
    for i, env in enumerate(envs):
        # A sub-env's episodes in the order it played them: its observations count up.
        mine = sorted((e for e in episodes.values() if _sub_env(e) == i), key=_first_observation)
        finished = [records for records in env.records if _finished(records)]
        # The episodes the env finished come first; after them at most the one running at close, truncated (its
        # agents that never completed a step ship nothing: it may hold only an agent that left early).
        ended, running = mine[: len(finished)], mine[len(finished) :]
        assert len(running) <= (0 if _finished(env.records[-1]) else 1)
        assert all(chunks[-1].is_terminated for e in ended for chunks in e.values())  # the env never truncates
        for records, episode in zip(finished, ended, strict=True):
            expected = {a: v for a, v in per_agent(records).items() if v[1]}  # agents that took a step
            got: dict[str, list] = {}
            for agent_id, agent_chunks in episode.items():
                obs, actions, rewards = got.setdefault(agent_id, [[], [], []])
                for chunk in agent_chunks:
                    observations = [float(o[0]) for o in chunk.get_observations()]
                    obs.extend(observations if not obs else observations[1:])  # a chunk starts where one ended
                    actions.extend(int(a) for a in chunk.get_actions())
                    rewards.extend(float(r) for r in chunk.get_rewards())
                assert sum(len(c) for c in agent_chunks) == len(actions)
            assert {a: [o, x, list(np.round(r, 6))] for a, (o, x, r) in got.items()} == expected
            compared += 1
    return compared


def _finished(records: list[tuple]) -> bool:
    return len(records) > 1 and records[-1][4]["__all__"]


def _first_observation(episode: dict[str, list[SingleAgentEpisode]]) -> float:
    return min(float(chunks[0].get_observations(0)[0]) for chunks in episode.values())


def _sub_env(episode: dict[str, list[SingleAgentEpisode]]) -> int:
    chunk = next(iter(episode.values()))[0]
    return int(chunk.multi_agent_episode_id.split("-")[1])  # "<session id>-<sub-env>-<random>"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n_agents=st.integers(1, 4),
    episode_steps=st.integers(1, 12),
    num_envs=st.integers(1, 3),
    fragment=st.one_of(st.none(), st.integers(1, 10)),
    count_steps_by=st.sampled_from(["env_steps", "agent_steps"]),
    mapping=st.sampled_from(["shared", "per_agent"]),
    flush_every=st.integers(0, 5),
)
def test_shipped_chunks_hold_what_the_env_emitted(
    seed, n_agents, episode_steps, num_envs, fragment, count_steps_by, mapping, flush_every
):
    envs = [JoinLeaveEnv(seed + i, n_agents, episode_steps) for i in range(num_envs)]
    agent_envs = AgentEnvs(envs)
    spec = run_spec(mapping, count_steps_by, fragment)
    policy = ActingCore.build(spec, *spaces_by_agent(agent_envs.agent_spaces), seed=seed)
    session = MultiAgentSession(
        MultiAgentSessionSpec("test", agent_envs.agent_spaces, num_envs, True),
        mapping_fn=policy.mapping_fn,
        rollout_fragment_length=fragment,
        count_steps_by=count_steps_by,
        lookback=1,
        write_back=policy.write_back,
    )
    decoder = AgentsStepDecoder({a: spaces[0] for a, spaces in agent_envs.agent_spaces.items()}, num_envs)
    steps, chunks = agent_envs.reset(seed=seed), []
    for t in range(40):
        message = pb.Step(agents=[_agents_step(s) for s in steps]).SerializeToString()  # as the client sends it
        episodes, _ = session.observe(decoder.decode(pb.Step.FromString(message)))
        if flush_every and t % flush_every == flush_every - 1:  # as a pausing server does, between the two
            held = session.unshipped_steps()  # what the learner link counts as held, in the learner's units
            flushed = session.flush()
            counted = len if count_steps_by == "agent_steps" else lambda c: c.multi_agent_env_steps
            flushed = decoded(flushed)
            # At most: an env step in which no agent took a step ships in no agent's chunk.
            assert sum(map(counted, flushed)) <= held and session.unshipped_steps() == 0
            chunks += flushed
        outputs = policy.act(episodes, True)
        chunks += decoded(session.record(outputs))
        if t == 39:  # the env's last step is the one the session saw last
            break
        answer = encode_agent_actions(outputs[Columns.ACTIONS_FOR_ENV])
        steps = agent_envs.step([{a: codec.from_value(v) for a, v in per_env.actions.items()} for per_env in answer])
    chunks += decoded(session.close())
    assert assert_chunks_match_the_env(envs, chunks) >= num_envs


@pytest.mark.parametrize("mapping", ["shared", "per_agent"])
async def test_through_a_real_server_and_client(server_factory, tmp_path, mapping):
    server = await server_factory(spec=run_spec(mapping, "env_steps", 4))
    envs = [JoinLeaveEnv(seed, n_agents=4, steps=10) for seed in range(3)]
    stats = await asyncio.wait_for(EnvClient(envs, target(server), seed=0).run(max_steps=150), 60)
    assert stats.env_steps >= 150
    await server.stop()
    chunks = [episode_from_proto(message) for message in shipped(tmp_path / "episodes")]
    assert assert_chunks_match_the_env(envs, chunks) >= 10
