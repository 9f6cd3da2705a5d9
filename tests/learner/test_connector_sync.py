"""MeanStdFilter statistics travel server -> learner (deltas, merged) -> every server (with the weights); a
state that does not fit the learner's pipeline is refused, and its batch's chunks taken all the same."""

from __future__ import annotations

import asyncio
import json
import logging

import gymnasium as gym
import numpy as np
import pytest
from support.batches import episode_batch
from support.learners import submit, weights_after
from support.servers import target

from rlgate.client.env_client import EnvClient
from rlgate.connectors.env_to_module.mean_std_filter import RunningStats
from rlgate.core import codec
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
                assert own < filter_count(server.host.core.env_to_module.get_state(), key) <= merged
    finally:
        await learner.stop()


def server_state(count=100, mean=0.5, m2=10.0) -> dict:
    """A CartPole server's first MeanStdFilter state: no global statistics yet, a delta of `count` observations."""
    delta = {"count": np.asarray(count), "mean": np.full(4, mean), "m2": np.full(4, m2)}
    return {"MeanStdFilter": {"global": [RunningStats.zeros((4,)).to_state()], "delta": [delta]}}


UNFIT = {
    "NaN delta": server_state(mean=np.nan, m2=np.nan),
    "negative count": server_state(count=-100),
    "count of shape [1]": server_state(count=[100]),
    "unknown piece": {"MeanStdFilter#2": server_state()["MeanStdFilter"]},
    # Each fits alone, but not merged with the state that came first: M2 overflows float64, the count int64.
    "mean merging to inf": server_state(mean=1e200),
    "count merging past int64": server_state(count=2**63 - 1),
}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy's, merging 1e200: refused after
@pytest.mark.parametrize("state", UNFIT.values(), ids=UNFIT)
async def test_a_connector_state_that_does_not_fit_is_refused_and_its_batch_taken(
    learner_settings, cartpole_chunks, http_get, caplog, state
):
    learner = LearnerServer(learner_settings(spec={"connectors": {"env_to_module": ["MeanStdFilter"]}}))
    await learner.start()
    try:
        chunks = cartpole_chunks(learner.learner.spec.algorithm.train_batch_size)
        fits, unfit = episode_batch([], 1), episode_batch(chunks, 2)
        fits.connector_state.CopyFrom(codec.to_value(server_state()))
        unfit.connector_state.CopyFrom(codec.to_value(state))
        with caplog.at_level(logging.WARNING, "rlgate.learner"):
            acks = await submit(learner, fits, unfit)  # the second fills a train batch: its update publishes
        assert [(ack.seq, ack.accepted, ack.rejected) for ack in acks] == [(1, 0, 0), (2, len(chunks), 0)]
        refusals = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(refusals) == 1 and refusals[0].startswith("rejected connector state from server test: ")
        published = codec.from_value((await weights_after(learner, 0)).connector_state)["MeanStdFilter"]
        stats = published["global"][0]  # the state that fits, alone
        assert stats["count"] == 100
        np.testing.assert_array_equal(stats["mean"], np.full(4, 0.5))
        np.testing.assert_array_equal(stats["m2"], np.full(4, 10.0))
        status = json.loads((await http_get(learner.http_port, "/status"))[1])
        assert status["rejected_chunks"] == {"malformed connector state": 1}
        assert status["env_steps_trained"] == learner.learner.spec.algorithm.train_batch_size
        metrics = (await http_get(learner.http_port, "/metrics"))[1]
        assert 'rlgate_learner_rejected_chunks_total{reason="malformed connector state"} 1.0' in metrics
    finally:
        await learner.stop()
