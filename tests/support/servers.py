"""Helpers for tests against a real inference server: tiny deterministic envs and raw stream drivers."""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np

from rlgate.client.env_client import ClientStats, EnvClient, hello_message
from rlgate.core import codec
from rlgate.server.main import InferenceServer
from rlgate.v1 import episode_pb2, tensor_pb2
from rlgate.v1 import policy_pb2 as pb

CONNECT = "/rlgate.v1.PolicyService/Connect"
# What a client may be told about what it sent; anything else (INTERNAL, UNKNOWN, ...) is the server's fault.
CLIENT_ERRORS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class SpaceEnv(gym.Env):
    """Deterministic env for any spaces: seeded observations, fixed episode length, checks every action.

    Each step pays reward 1; the episode terminates after `length` steps. An action outside the action
    space raises, so a test fails when the server sends one (e.g. an unclipped Box action).
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, length: int = 5) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.length = length
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(1 << 31)))
        self._t = 0
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if not self.action_space.contains(
            np.asarray(action, dtype=self.action_space.dtype)
            if isinstance(self.action_space, gym.spaces.Box)
            else action
        ):
            raise AssertionError(f"action {action!r} is not in {self.action_space}")
        self._t += 1
        return self.observation_space.sample(), 1.0, self._t >= self.length, False, {}


BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DISCRETE2 = gym.spaces.Discrete(2)
# examples/tictactoe.toml without its PPO settings: "main" against itself or a frozen "random", drawn per game.
SELF_PLAY = {
    part: fields
    for part, fields in tomllib.loads((Path(__file__).parents[2] / "examples" / "tictactoe.toml").read_text()).items()
    if part != "algorithm"
}


def target(server: InferenceServer) -> str:
    return f"127.0.0.1:{server.port}"


@asynccontextmanager
async def running_client(client: EnvClient) -> AsyncIterator[asyncio.Task[ClientStats]]:
    """Run an EnvClient in the background; stop it (and re-raise its error, if any) on exit."""
    task = asyncio.create_task(client.run())
    try:
        yield task
    finally:
        client.stop()
        await asyncio.wait_for(task, 10)


async def until(condition: Callable[[], bool], timeout: float) -> None:
    """Poll `condition` until it holds (bounded in time, not a sleep)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def wait_for_steps(client: EnvClient, at_least: int, timeout: float = 10.0) -> None:
    """Wait until the client has made `at_least` env steps (bounded in time, not a sleep)."""
    async with asyncio.timeout(timeout):
        while client.stats.env_steps < at_least:
            await asyncio.sleep(0.005)


async def longest_stall(client: EnvClient, done: asyncio.Event) -> float:
    """Seconds of the longest stretch in which the client made no env step, until `done`."""
    last_steps, last_change, longest = client.stats.env_steps, time.monotonic(), 0.0
    while not done.is_set():
        await asyncio.sleep(0.02)
        now = time.monotonic()
        if client.stats.env_steps != last_steps:
            last_steps, last_change = client.stats.env_steps, now
        longest = max(longest, now - last_change)
    return longest


class RawStream:
    """A Connect stream driven by hand, for sending exactly what a test wants (even invalid bytes)."""

    def __init__(self, server: InferenceServer, metadata: tuple = ()) -> None:
        self.channel = grpc.aio.insecure_channel(target(server), options=[("grpc.max_send_message_length", 64 << 20)])
        self.call = self.channel.stream_stream(
            CONNECT, request_serializer=None, response_deserializer=pb.ServerMessage.FromString
        )(metadata=metadata)

    async def send(self, message: pb.ClientMessage | bytes) -> None:
        """Write one message; a stream the server already ended (e.g. a refused token) is left to status()."""
        try:
            await self.call.write(message if isinstance(message, bytes) else message.SerializeToString())
        except grpc.aio.AioRpcError:
            if self.call.done():
                return
            raise

    async def recv(self) -> pb.ServerMessage:
        return await asyncio.wait_for(self.call.read(), 10)

    async def status(self) -> tuple[grpc.StatusCode, str]:
        """The stream's final status (waits for the server to end it)."""
        code = await asyncio.wait_for(self.call.code(), 10)
        return code, await self.call.details()

    async def close(self) -> None:
        await self.channel.close()


def hello(
    observation_space: gym.Space = BOX4,
    action_space: gym.Space = DISCRETE2,
    num_envs: int = 1,
    explore: bool = True,
) -> pb.ClientMessage:
    return hello_message(observation_space, action_space, num_envs, explore, "raw")


def step(
    obs: Any, n: int = 1, reward: Any = None, terminated: Any = None, infos: list[dict] | None = None
) -> pb.ClientMessage:
    """A step message; `reward` and `terminated` may be arrays or ready Tensor messages (to send malformed ones)."""
    if not isinstance(reward, tensor_pb2.Tensor):
        reward = codec.to_tensor(np.zeros(n) if reward is None else reward)
    if not isinstance(terminated, tensor_pb2.Tensor):
        terminated = codec.to_tensor(np.zeros(n, bool) if terminated is None else terminated)
    return pb.ClientMessage(
        step=pb.Step(
            obs=codec.to_value(obs),
            reward=reward,
            terminated=terminated,
            truncated=codec.to_tensor(np.zeros(n, bool)),
            infos=[codec.to_struct(info) for info in infos or ()],
        )
    )


def shipped(directory: Path) -> list[episode_pb2.Episode]:
    """The episode chunks a server wrote to its episode directory."""
    return [episode_pb2.Episode.FromString(p.read_bytes()) for p in sorted(directory.glob("*.pb"))]
