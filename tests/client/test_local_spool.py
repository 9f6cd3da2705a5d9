"""A local-inference client's spool: what the server has not acknowledged stays on disk and is sent at the client's
next start under the same id; two live clients with one id never share a spool."""

from __future__ import annotations

import asyncio

import gymnasium as gym
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient
from rlgate.client.local import claim_spool
from rlgate.v1 import episode_pb2, learner_pb2

ENV = "CartPole-v1"


def cartpoles() -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(2)])


def spooled_chunks(directory) -> set[tuple[str, int]]:
    """(episode id, chunk index) of every chunk in a spool's batch files."""
    found = set()
    for path in directory.glob("*.pb"):
        for table in learner_pb2.EpisodeBatch.FromString(path.read_bytes()).chunks:
            found |= set(zip(table.ids, table.chunk_indices, strict=True))
    return found


async def test_batches_the_server_did_not_take_are_sent_at_the_next_start(server_factory, tmp_path):
    first = await server_factory(env=ENV, episode_dir=tmp_path / "first")
    client = EnvClient(
        cartpoles(), target(first), inference="local", client_id="resumer", spool_dir=tmp_path / "spool",
        drain_timeout_s=0.2, seed=0,
    )  # fmt: skip
    spool = tmp_path / "spool" / "resumer"
    async with running_client(client):
        await until(lambda: first.local.env_steps > 0, timeout=30)
        await first.stop()  # gone: the client acts on with the weights it has, and spools what it ships
        await until(lambda: len(spooled_chunks(spool)) >= 3, timeout=30)
    left = spooled_chunks(spool)
    assert left, "the stopped client left its unacknowledged batches in its spool"

    second = await server_factory(env=ENV, episode_dir=tmp_path / "second")
    again = EnvClient(
        cartpoles(), target(second), inference="local", client_id="resumer", spool_dir=tmp_path / "spool", seed=1
    )
    await asyncio.wait_for(again.run(max_steps=50), 30)
    await second.stop()
    assert not spooled_chunks(spool)
    written = {
        (message.id, message.chunk_index)
        for message in (episode_pb2.Episode.FromString(p.read_bytes()) for p in (tmp_path / "second").glob("*.pb"))
    }
    assert left <= written  # every chunk the first run left reached the next server


def test_two_live_clients_with_one_id_get_a_spool_each_and_a_dead_ones_is_taken_over(tmp_path):
    first, lock = claim_spool(tmp_path, "env-0")
    second, _held = claim_spool(tmp_path, "env-0")  # held open: the second process still runs
    assert (first.name, second.name) == ("env-0", "env-0-2")
    lock.close()  # the first process is gone: its lock with it
    third, _ = claim_spool(tmp_path, "env-0")
    assert third == first
    assert claim_spool(tmp_path, "mypkg.envs:Corridor/1")[0].name == "mypkg.envs_Corridor_1"
