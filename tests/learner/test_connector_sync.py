"""MeanStdFilter statistics travel server -> learner (deltas, merged) -> every server (with the weights)."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest
from support.servers import target

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer

ENV = "CartPole-v1"


def filter_count(state: dict, key: str = "MeanStdFilter") -> int:
    """Observations counted in a pipeline state's MeanStdFilter global statistics (CartPole: one Box)."""
    return int(state[key]["global"][0]["count"])


# Two filters of one class keep their own statistics under their own keys (MeanStdFilter, MeanStdFilter#2).
@pytest.mark.parametrize(
    "pieces", [["MeanStdFilter"], [{"type": "MeanStdFilter", "de_std_to_one": False}, "MeanStdFilter"]]
)
async def test_two_servers_statistics_are_merged_by_the_learner_and_sent_back(learner_settings, server_factory, pieces):
    spec = {"connectors": {"env_to_module": pieces}, "sampling": {"rollout_fragment_length": 16}}
    keys = ["MeanStdFilter", "MeanStdFilter#2"][: len(pieces)]
    learner = LearnerServer(learner_settings(spec=spec))
    await learner.start()
    try:
        servers = [
            await server_factory(
                learner=f"127.0.0.1:{learner.port}",
                server_id=f"server-{i}",
            )
            for i in range(2)
        ]
        clients = [
            EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make(ENV)] * 2), target(s), seed=10 * i)
            for i, s in enumerate(servers)
        ]
        await asyncio.wait_for(asyncio.gather(*(c.run(max_steps=600) for c in clients)), 60)
        rows = [s.metrics.batch_size.collect()[0] for s in servers]
        seen = [next(x.value for x in r.samples if x.name.endswith("_sum")) for r in rows]  # observations filtered
        for server in servers:
            await server.stop()  # ships the last chunks and their statistics
        state = learner.learner.connectors.get_state()
        assert sorted(state) == keys
        for key in keys:
            merged = filter_count(state, key)
            # The learner holds statistics from both servers: more than either saw alone, never more than both did.
            assert max(seen) < merged <= sum(seen)
            # Each server normalises with the merged statistics that came back with the weights: both servers'.
            for server, own in zip(servers, seen, strict=True):
                assert own < filter_count(server.policy.env_to_module.get_state(), key) <= merged
    finally:
        await learner.stop()
