"""Load that follows replicas: a server hands its sessions over at their episodes' end (max session age, or a
stop), and clients reconnecting through one target spread over the replicas behind it, with no episode cut."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import pytest
from support.servers import BOX4, DISCRETE2, RawStream, SpaceEnv, hello, running_client, shipped, step, until

from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.server.main import InferenceServer
from rlgate.server.policy_service import HANDED_OVER
from rlgate.server.settings import ServerSettings
from rlgate.service.process import reserve_shared_port
from rlgate.v1 import policy_pb2 as pb

LENGTH = 40  # steps per episode: longer than a rollout fragment (32), so episodes ship as two chunks
CLIENTS = 8


def whole_episodes(
    directories: list[Path], clients: list[EnvClient], observation_space: gym.Space = BOX4, action_space=DISCRETE2
) -> list[tuple[Any, int]]:
    """Every episode the servers shipped, as its last chunk and its length, once checked: its chunks contiguous
    (0..k, each starting where the last ended), none but the last ended; each session's episodes numbered without a
    gap, and the chunks hold every env step the clients took (none lost, none twice)."""
    chunks = defaultdict(list)
    for directory in directories:
        for message in shipped(directory):
            chunks[message.id].append(episode_from_proto(message, observation_space, action_space))
    episodes, steps = [], 0
    numbers = defaultdict(set)
    for episode_id, parts in chunks.items():
        parts.sort(key=lambda e: e.chunk_index)
        assert [e.chunk_index for e in parts] == list(range(len(parts))), episode_id
        t = 0
        for e in parts:
            assert e.t_started == t, episode_id
            t += len(e)
        steps += t
        assert all(not (e.is_terminated or e.is_truncated) for e in parts[:-1]), episode_id
        session, _, number = episode_id.rpartition("-")
        numbers[session].add(int(number))
        episodes.append((parts[-1], t))
    for session, taken in numbers.items():
        assert taken == set(range(len(taken))), f"session {session}: an episode is missing"
    assert steps == sum(c.stats.env_steps for c in clients)
    return episodes


def assert_whole_episodes(directories: list[Path], clients: list[EnvClient]) -> int:
    """`whole_episodes`, each complete (LENGTH steps, terminated) but at most one per client, cut off by that
    client's own stop at the end. Returns the number of complete episodes."""
    complete, cut = 0, 0
    for last, length in whole_episodes(directories, clients):
        if last.is_terminated and not last.is_truncated and length == LENGTH:
            complete += 1
        else:
            assert length < LENGTH and not last.is_terminated, last.id_
            cut += 1
    assert cut <= len(clients)
    return complete


async def start_server(directory: Path, port: int = 0, **settings: object) -> InferenceServer:
    fields: dict = {
        "host": "127.0.0.1",
        "port": port,
        "http_port": 0,
        "episode_dir": directory,
        "spool_dir": directory.parent / f"{directory.name}-spool",
        "seed": 0,
        "env": None,
        **settings,
    }
    server = InferenceServer(ServerSettings(**fields), shared_port=port != 0)
    await server.start()
    return server


async def first_replica(
    stack: AsyncExitStack, directory: Path, clients: int, **settings: object
) -> tuple[InferenceServer, int, list[EnvClient]]:
    """Replica A, started; the port of a replica B to come, held (bound, not listening) until B starts on it; and
    `clients` env clients (not running yet) of a target naming both, as a Service's name lists every replica: they
    reach A alone until B starts. The stack stops A (unless the test did) and frees the port."""
    reservation = reserve_shared_port("127.0.0.1", 0, "--port")
    stack.callback(reservation.close)
    a = await start_server(directory, **settings)

    async def stop_a() -> None:
        if not a.service.draining:
            await a.stop()

    stack.push_async_callback(stop_a)
    port_b = reservation.getsockname()[1]
    shared = f"ipv4:127.0.0.1:{a.port},127.0.0.1:{port_b}"
    env_clients = [
        EnvClient(SpaceEnv(BOX4, DISCRETE2, length=LENGTH), shared, client_id=f"c{i}", seed=i, max_backoff_s=0.05)
        for i in range(clients)
    ]
    return a, port_b, env_clients


def halves(a: InferenceServer, b: InferenceServer) -> bool:
    """Every client has a session, and each replica serves three to five of the eight."""
    return 3 <= len(b.service.sessions) <= 5 and len(a.service.sessions) + len(b.service.sessions) == CLIENTS


@pytest.mark.slow
async def test_sessions_spread_over_a_replica_started_later_with_no_episode_cut(tmp_path):
    """Two replicas behind one target, the second started once every client is on the first: within a few session
    ages both serve about half the sessions, and every episode either shipped is whole, none lost."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    async with AsyncExitStack() as stack:
        a, port_b, clients = await first_replica(stack, dirs[0], CLIENTS, max_session_age_s=1.0)
        async with AsyncExitStack() as running:  # the clients stop first, then the servers
            for client in clients:
                await running.enter_async_context(running_client(client))
            await until(lambda: len(a.service.sessions) == CLIENTS and all(c.stats.episodes for c in clients), 10)
            b = await start_server(dirs[1], port=port_b, max_session_age_s=1.0)
            stack.push_async_callback(b.stop)
            started = time.monotonic()
            await until(lambda: halves(a, b), 15)
            spread_s = time.monotonic() - started
            await until(lambda: all(c.stats.episodes >= 3 for c in clients), 10)
    assert sum(c.stats.handovers for c in clients) >= 3  # B's sessions came by handovers,
    assert sum(c.stats.reconnects for c in clients) == 0  # none through a broken stream
    assert assert_whole_episodes(dirs, clients) >= 3 * CLIENTS
    assert spread_s < 15


async def stopping(server: InferenceServer) -> asyncio.Task:
    """Start the server's graceful stop (what SIGTERM runs); returns once it drains."""
    task = asyncio.create_task(server.stop())
    await until(lambda: server.service.draining, 5)
    return task


async def test_each_sub_env_finishes_its_episode_and_the_one_it_begins_after_is_not_recorded(tmp_path):
    """Two sub-envs ending at different steps: the first one's next episode is acted on but never shipped, and the
    answer to the step that ends the second one says reconnect."""
    server = await start_server(tmp_path / "episodes")
    raw = RawStream(server)
    obs = np.zeros((2, 4), np.float32)
    try:
        await raw.send(hello(num_envs=2))
        await raw.recv()
        reconnect = []
        for ends in ([False, False], [False, False], [True, False], [False, False], [False, True]):
            if len(reconnect) == 2:  # sub-env 0's episode ends in the next step, sub-env 1's two steps later
                stop = await stopping(server)
            await raw.send(step(obs, n=2, terminated=np.array(ends)))
            answer = (await raw.recv()).actions
            assert codec.from_value(answer.actions, "actions").shape == (2,)  # a parked sub-env is acted on too
            reconnect.append(answer.reconnect)
        await raw.send(pb.ClientMessage(close=pb.Close()))
        assert (await raw.status())[0] == grpc.StatusCode.OK
        await asyncio.wait_for(stop, 10)
    finally:
        await raw.close()
    assert reconnect == [False, False, False, False, True]
    episodes = [episode_from_proto(m, BOX4, DISCRETE2) for m in shipped(tmp_path / "episodes")]
    assert sorted(len(e) for e in episodes) == [2, 4]  # sub-env 0's second episode (2 steps) is not among them
    assert all(e.is_terminated and not e.session_closed for e in episodes)


async def test_a_client_that_ignores_reconnect_gets_unavailable_and_nothing_is_cut(tmp_path):
    """An old client, which reads no reconnect flag, sends the next episode's reset observation: its stream ends
    UNAVAILABLE (retryable: it reconnects), and the episode it ran was shipped whole."""
    server = await start_server(tmp_path / "episodes")
    raw = RawStream(server)
    obs = np.zeros((1, 4), np.float32)
    try:
        await raw.send(hello())
        await raw.recv()
        await raw.send(step(obs))
        await raw.recv()
        stop = await stopping(server)
        reconnect = []
        for t in range(3):  # the episode goes on: a stopping server does not cut it
            await raw.send(step(obs, terminated=np.array([t == 2])))
            reconnect.append((await raw.recv()).actions.reconnect)
        await raw.send(step(obs))
        status = await raw.status()
        await asyncio.wait_for(stop, 10)
    finally:
        await raw.close()
    assert reconnect == [False, False, True]
    assert status == (grpc.StatusCode.UNAVAILABLE, HANDED_OVER)
    (episode,) = [episode_from_proto(m, BOX4, DISCRETE2) for m in shipped(tmp_path / "episodes")]
    assert len(episode) == 3 and episode.is_terminated and not episode.session_closed


async def test_a_stopping_server_hands_every_client_over_at_its_next_reset_within_the_drain_timeout(tmp_path):
    """A graceful stop (what SIGTERM runs) hands each session over at its episode's end: the clients carry on on the
    other replica (a rolling update), the stop returns well within drain_timeout_s, and no episode is cut."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    async with AsyncExitStack() as stack:
        a, port_b, clients = await first_replica(stack, dirs[0], 4, drain_timeout_s=10)
        async with AsyncExitStack() as running:  # the clients stop first, then the servers
            for client in clients:
                await running.enter_async_context(running_client(client))
            await until(lambda: len(a.service.sessions) == len(clients), 10)
            await until(lambda: all(c.stats.env_steps >= LENGTH // 2 for c in clients), 10)
            b = await start_server(dirs[1], port=port_b)
            stack.push_async_callback(b.stop)
            started = time.monotonic()
            await asyncio.wait_for(a.stop(), 10)
            drain_s = time.monotonic() - started
            await until(lambda: len(b.service.sessions) == len(clients), 10)
            await until(lambda: all(c.stats.episodes >= 3 for c in clients), 10)
    assert drain_s < 5  # one episode's end, not the 10 s drain timeout
    assert [c.stats.handovers for c in clients] == [1] * len(clients)
    assert a.metrics.handovers._value.get() == len(clients)
    assert assert_whole_episodes(dirs, clients) >= 2 * len(clients)


def local_clients(target: str, spool: Path, count: int) -> list[EnvClient]:
    """`count` local-inference clients of one CartPole each, acting in torch."""
    return [
        EnvClient(
            gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")]),
            target,
            client_id=f"l{i}",
            seed=i,
            max_backoff_s=0.05,
            inference="local",
            spool_dir=spool,
            backend="torch",
        )
        for i in range(count)
    ]


def assert_whole_local_episodes(directories: list[Path], clients: list[EnvClient]) -> int:
    """`whole_episodes` of local clients' CartPoles, in one session per client across its moves, each ended by its
    env but at most one per client, cut by that client's own stop at the end. Returns the number ended by the env.

    A cut episode's last chunk says `session_closed`, unless the stop came right after a chunk had shipped every
    step it had (a pause for acks flushes the running episodes): a chunk holds at least one step, so there is
    nothing left to close it with, and its last chunk is an unended one (a learner counts no return for it)."""
    spaces = gym.make("CartPole-v1")
    episodes = whole_episodes(directories, clients, spaces.observation_space, spaces.action_space)
    sessions = [last.id_.rpartition("-")[0] for last, _ in episodes]
    assert len(set(sessions)) == len(clients)
    ended = [last.is_done and not last.session_closed for last, _ in episodes]
    cut = [session for session, done in zip(sessions, ended, strict=True) if not done]
    assert len(cut) == len(set(cut)), f"more than one episode of a session cut: {cut}"
    return len(episodes) - len(cut)


async def test_local_clients_spread_over_a_replica_started_later_and_a_stopping_one_hands_them_over(tmp_path):
    """Local-inference clients (their weights stream and episode stream to the server) behind one target naming two
    replicas, the second started once they are all on the first: at their max session age the server ends their
    weights stream, each client lets its episode stream finish and reconnects through the target, and they spread
    over both; a graceful stop of the first hands its clients over at once (their episodes run on in the client).
    Every episode either replica took is whole, none lost or taken twice, and no client's spool keeps a batch."""
    dirs, spool = [tmp_path / "a", tmp_path / "b"], tmp_path / "client-spool"
    settings = {"env": "CartPole-v1", "max_session_age_s": 1.0}
    async with AsyncExitStack() as stack:
        a, port_b, _ = await first_replica(stack, dirs[0], 0, **settings)
        clients = local_clients(f"ipv4:127.0.0.1:{a.port},127.0.0.1:{port_b}", spool, 4)
        async with AsyncExitStack() as running:  # the clients stop first (their spools drained), then the servers
            for client in clients:
                await running.enter_async_context(running_client(client))
            await until(lambda: len(a.local.clients) == len(clients) and all(c.stats.episodes for c in clients), 20)
            b = await start_server(dirs[1], port=port_b, **settings)
            stack.push_async_callback(b.stop)
            await until(lambda: b.local.clients and len(a.local.clients) + len(b.local.clients) == len(clients), 20)
            moved = sum(c.stats.handovers for c in clients)
            await asyncio.wait_for(a.stop(), 10)
            await until(lambda: len(b.local.clients) == len(clients), 10)
            steps = [c.stats.env_steps for c in clients]
            await until(lambda: all(c.stats.env_steps > s + 100 for c, s in zip(clients, steps, strict=True)), 10)
    # Moved by the max age; by the stop, every client left on the first is on the second (above): handed over, or, one
    # whose reconnect at its max age met the stopping replica, told UNAVAILABLE and reconnected (not a handover).
    assert moved >= 1
    assert not list(spool.rglob("*.pb"))
    assert assert_whole_local_episodes(dirs, clients) >= 2 * len(clients)


async def test_a_stop_just_as_a_local_clients_session_age_ends_its_weights_stream_drains_without_an_error(
    server_factory,
):
    """Under load a stop can come between a WatchWeights stream's age limit expiring and that stream ending (the
    limit is then an expiring asyncio.Timeout, still among the streams' limits): the drain passes over it, as the
    stream ends anyway, instead of failing the stop with "Cannot change state of expiring Timeout"."""
    server = await server_factory(env="CartPole-v1")
    watches, limits = server.service._watches, []

    async def watching() -> None:  # as watch_weights holds a stream's age limit
        async with asyncio.timeout(None) as limit:
            watches.add(limit)
            limits.append(limit)
            try:
                await asyncio.sleep(60)
            finally:
                watches.discard(limit)

    stream = asyncio.ensure_future(watching())
    await until(lambda: limits, timeout=5)
    (limit,) = limits
    limit.reschedule(asyncio.get_running_loop().time())  # its age reached: it expires at the loop's next turn
    await asyncio.sleep(0)
    assert limit.expired() and limit in watches  # expiring: its stream has not ended yet
    await server.stop()
    with pytest.raises(TimeoutError):
        await stream
