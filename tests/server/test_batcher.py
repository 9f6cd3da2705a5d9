"""The Batcher on its own, with a real Policy and Session: when a request runs at once, and when it queues."""

from __future__ import annotations

import asyncio

import numpy as np
from support.servers import BOX4, DISCRETE2

from rlgate.core.columns import Columns
from rlgate.server.batcher import Batcher
from rlgate.server.metrics import ServerMetrics
from rlgate.server.policy import Policy
from rlgate.server.session import Session, SessionSpec
from rlgate.spec.run import RunSpec


def batcher_and_rows(paused: list[bool]) -> tuple[Batcher, np.ndarray, object]:
    """A batcher (not started: its task never runs) over a fresh policy, and one session's first rows."""
    metrics = ServerMetrics()
    policy = Policy.create(RunSpec(), BOX4, DISCRETE2, metrics=metrics, seed=0)
    batcher = Batcher(policy, max_batch_size=256, metrics=metrics, waiting_for_acks=lambda: paused[0])
    session = Session(SessionSpec("t", BOX4, DISCRETE2, 3, explore=True), rollout_fragment_length=8, lookback=1)
    obs = np.zeros((3, 4), np.float32)
    episodes, _ = session.observe(obs, np.zeros(3, np.float32), np.zeros(3, bool), np.zeros(3, bool), None)
    return batcher, obs, episodes


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
