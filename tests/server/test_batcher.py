"""The Batcher on its own, with a real Policy and Session: when a request runs at once, and when it queues."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.servers import BOX4, DISCRETE2

from rlgate.core.columns import Columns
from rlgate.episodes.session import Session, SessionSpec
from rlgate.policy.acting import ActingCore
from rlgate.server.batcher import Batcher
from rlgate.server.metrics import ServerMetrics
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec


def batcher_and_rows(paused: list[bool]) -> tuple[Batcher, np.ndarray, object]:
    """A batcher (not started: its task never runs) over a fresh policy, and one session's first rows."""
    metrics = ServerMetrics()
    policy = ActingCore.build(RunSpec(), BOX4, DISCRETE2, seed=0)
    batcher = Batcher(policy, max_batch_size=256, metrics=metrics, waiting_for_acks=lambda: paused[0])
    session = Session(SessionSpec("t", BOX4, DISCRETE2, 3, explore=True), rollout_fragment_length=8, lookback=1)
    obs = np.zeros((3, 4), np.float32)
    episodes, _ = session.observe(obs, np.zeros(3, np.float32), np.zeros(3, bool), np.zeros(3, bool), None)
    return batcher, obs, episodes


async def one_batch(batcher: Batcher, requests: list[asyncio.Task]) -> list:
    """Start the batcher once the requests are all queued (its first batch takes them all); their results or
    exceptions, in order."""
    await asyncio.sleep(0)
    assert len(batcher._queue) == len(requests)
    batcher.start()
    try:
        return await asyncio.wait_for(asyncio.gather(*requests, return_exceptions=True), 10)
    finally:
        await batcher.stop()


async def test_a_lone_sessions_request_runs_at_once_without_the_batchers_task():
    batcher, obs, episodes = batcher_and_rows([False])
    outputs = await asyncio.wait_for(batcher.compute(obs, episodes, True, alone=True), 10)
    assert outputs[Columns.ACTIONS_FOR_ENV].shape == (3,)
    batch = batcher.metrics.batch_size.collect()[0]
    assert next(s.value for s in batch.samples if s.name.endswith("_count")) == 1  # one batch, counted


async def test_a_request_that_others_could_join_or_a_paused_one_waits_for_the_batchers_task():
    paused = [False]
    batcher, obs, episodes = batcher_and_rows(paused)
    shared = asyncio.create_task(batcher.compute(obs, episodes, True))  # alone=False: another session is open
    await asyncio.sleep(0)
    paused[0] = True
    held = asyncio.create_task(batcher.compute(obs, episodes, True, alone=True))  # alone, but sampling paused
    await asyncio.sleep(0)
    assert len(batcher._queue) == 2 and not shared.done() and not held.done()
    paused[0] = False
    batcher.start()
    batcher.wake()
    try:
        first, second = await asyncio.wait_for(asyncio.gather(shared, held), 10)
    finally:
        await batcher.stop()
    assert first[Columns.ACTIONS_FOR_ENV].shape == second[Columns.ACTIONS_FOR_ENV].shape == (3,)


async def test_a_request_that_breaks_a_piece_fails_alone_not_the_requests_sharing_its_batch():
    """A user's piece that one session's in-bounds observation breaks fails that request only: the batch runs
    again request by request, and the other sessions' requests in it get their actions."""
    spec = RunSpec.parse({"connectors": {"env_to_module": [{"type": "support.pieces:FailOnValue", "value": 0.5}]}}, "t")
    metrics = ServerMetrics()
    policy = ActingCore.build(spec, BOX4, DISCRETE2, imports=ImportPolicy(["support"]), seed=0)
    batcher = Batcher(policy, max_batch_size=256, metrics=metrics)
    requests = []
    for value in (0.0, 0.5, -0.5):  # the middle session's observation breaks the piece
        session = Session(SessionSpec("t", BOX4, DISCRETE2, 2, explore=True), rollout_fragment_length=8, lookback=1)
        obs = np.full((2, 4), value, np.float32)
        episodes, _ = session.observe(obs, np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), None)
        requests.append(asyncio.create_task(batcher.compute(obs, episodes, True)))  # queued: the task runs later
    results = await one_batch(batcher, requests)
    good, bad, other = results
    assert isinstance(bad, ValueError) and "not for me" in str(bad)
    assert good[Columns.ACTIONS_FOR_ENV].shape == other[Columns.ACTIONS_FOR_ENV].shape == (2,)
    batch_sizes = metrics.batch_size.collect()[0]
    assert next(s.value for s in batch_sizes.samples if s.name.endswith("_count")) == 2  # the two that ran alone


@pytest.mark.parametrize("thread", [False, True])
async def test_a_batch_run_again_request_by_request_counts_each_row_once_in_the_pieces_statistics(thread):
    """A piece after a MeanStdFilter fails one request of a batch: the filter had added the whole batch to its
    statistics, and the requests then run again one by one; its statistics count each row once, as if each
    request had run alone, not the batch's rows twice."""
    pieces = [{"type": "MeanStdFilter", "clip_by_value": 0.5}, {"type": "support.pieces:FailOnValue", "value": 0.5}]
    spec = RunSpec.parse({"connectors": {"env_to_module": pieces}}, "t")
    metrics = ServerMetrics()
    policy = ActingCore.build(spec, BOX4, DISCRETE2, imports=ImportPolicy(["support"]), seed=0)
    batcher = Batcher(policy, max_batch_size=256, metrics=metrics, thread=thread)
    requests = []
    for value in (0.0, 1000.0, 0.0):  # the middle one normalises to the clip bound, which the piece fails on
        session = Session(SessionSpec("t", BOX4, DISCRETE2, 2, explore=True), rollout_fragment_length=8, lookback=1)
        obs = np.full((2, 4), value, np.float32)
        episodes, _ = session.observe(obs, np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), None)
        requests.append(asyncio.create_task(batcher.compute(obs, episodes, True)))
    good, bad, other = await one_batch(batcher, requests)
    assert isinstance(bad, ValueError) and not isinstance(good, Exception) and not isinstance(other, Exception)
    (state,) = policy.env_to_module.get_state().values()
    assert state["delta"][0]["count"] == 6  # three requests of two rows, each row once


@pytest.mark.parametrize("thread", [False, True])
async def test_a_multi_agent_batch_run_again_request_by_request_counts_each_row_once_in_the_statistics(
    examples_importable, thread
):
    """The multi-agent form: a MeanStdFilter normalises in the episodes and leaves what it normalised as it is
    when the requests run again one by one, so each agent's observation enters its statistics once (none
    twice, none lost) while the request that breaks a later piece fails alone."""
    from examples.multi_agent_cartpole import MultiAgentCartPole
    from rlgate.envs.agent_envs import AgentEnvs
    from rlgate.server.multi_agent_batcher import MultiAgentBatcher
    from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
    from rlgate.spec.multi_agent import spaces_by_agent

    pieces = [{"type": "MeanStdFilter", "multi_agent": True}, {"type": "support.pieces:FailOnMarkedEpisode"}]
    spec = RunSpec.parse(
        {
            "env": {"id": "examples.multi_agent_cartpole:MultiAgentCartPole"},
            "multi_agent": {},
            "connectors": {"env_to_module": pieces},
        },
        "t",
    )
    envs = AgentEnvs([MultiAgentCartPole()])
    metrics = ServerMetrics()
    policy = ActingCore.build(spec, *spaces_by_agent(envs.agent_spaces), imports=ImportPolicy(["support"]))
    batcher = MultiAgentBatcher(policy, max_batch_size=256, metrics=metrics, thread=thread)
    requests = []
    for seed in range(3):
        session = MultiAgentSession(
            MultiAgentSessionSpec("t", envs.agent_spaces, 1, True),
            mapping_fn=policy.mapping_fn,
            rollout_fragment_length=None,
            count_steps_by="env_steps",
            lookback=1,
            write_back=policy.write_back,
        )
        episodes, _ = session.observe(envs.reset(seed=seed))
        episodes[0].custom_data["fail"] = seed == 1
        requests.append(asyncio.create_task(batcher.compute(None, episodes, True)))
    good, bad, other = await one_batch(batcher, requests)
    assert isinstance(bad, ValueError) and not isinstance(good, Exception) and not isinstance(other, Exception)
    (state,) = policy.env_to_module.get_state().values()
    assert {agent: stats["delta"][0]["count"] for agent, stats in state.items()} == {"agent_0": 3, "agent_1": 3}
