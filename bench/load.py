"""A load-generating process: K env clients, each with its own gRPC connection and stream, E sub-envs each.

Lean on purpose, so that the server is what gets measured: raw bytes on the stream, CartPole stepped as
numpy arrays (`bench.cartpole`), no retries, no progress. With `--local-spool DIR` the clients act themselves
instead: each an `EnvClient(inference="local")` stepping gymnasium's vectorised CartPole-v1, which sends its
server its episodes (a round trip is then one vector step: acting, recording, stepping the env). The bench
drives it over stdin / stdout so that every load process measures the same window. It prints `ready` once every
client has had its first answer, then obeys one command per line:

- `measure`: start a measuring window, and print `measuring` once it has started (the bench starts its
  server-side window only then, so a load process that is slow to read stdin cannot shrink its window);
- `report`: end it and print one JSON line: env steps answered, seconds, the round trip of every message
  in microseconds, this process's CPU seconds, and the bytes of the step messages sent and the answers
  received (protobuf, without gRPC's framing);
- `stop` (or end of input): finish each client's step in flight, close every stream, print
  `{"total_steps": ...}` (env steps answered since the start) and exit.

Env steps are transitions, as the server counts them: a reset observation is not one.
Run: `python -m rlgate.bench.load --target HOST:PORT --clients K --envs E [--real-envs | --spec FILE]
[--local-spool DIR]` (`--spec`: the env of a run spec file, made as `rlgate env` makes it: its wrappers, real envs;
E at least 2).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import grpc
import gymnasium as gym
import numpy as np

from rlgate.bench.cartpole import SyntheticCartPole, make_env, spaces
from rlgate.client.connection import ClientStats
from rlgate.client.env_client import EnvClient, hello_message, step_message
from rlgate.core import codec
from rlgate.service.settings import Backend
from rlgate.spec.env import make_env as make_spec_env
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.v1 import policy_pb2 as pb

CONNECT = "/rlgate.v1.PolicyService/Connect"
# Each client its own TCP connection, as separate env processes would have (grpc shares one by default).
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


class LoadGenerator:
    """The clients of one process and the window they are measured in."""

    def __init__(
        self,
        target: str,
        clients: int,
        envs: int,
        real_envs: bool,
        spec: Path | None = None,
        local_spool: Path | None = None,
        local_backend: Backend = "torch",
    ) -> None:
        """`local_spool`: the clients act themselves (local inference), keeping their episodes there until the
        server has them, with their forward pass in `local_backend`."""
        self.target = target
        self.local_spool = local_spool
        self.local_backend = local_backend
        self.clients = clients
        self.envs = envs
        self.make_env = _spec_envs(spec, envs) if spec else functools.partial(make_env, envs, real=real_envs)
        self.stopping = False
        self.total_steps = 0
        self.ready = asyncio.Event()
        self._answered_once = 0
        self._measuring = False
        self._steps = 0
        self._latencies: list[float] = []
        self._started = 0.0
        self._cpu = 0.0
        self._bytes_out = self._bytes_in = 0
        observation_space, action_space = spaces() if spec is None else _single_spaces(self.make_env())
        self._hello = hello_message(observation_space, action_space, envs, True, "bench").SerializeToString()

    def begin_window(self) -> None:
        self._steps, self._latencies = 0, []
        self._bytes_out = self._bytes_in = 0
        self._started, self._cpu = time.perf_counter(), time.process_time()
        self._measuring = True

    def end_window(self) -> dict:
        self._measuring = False
        return {
            "steps": self._steps,
            "seconds": time.perf_counter() - self._started,
            "latency_us": [round(s * 1e6) for s in self._latencies],
            "cpu_s": time.process_time() - self._cpu,
            "bytes_out": self._bytes_out,
            "bytes_in": self._bytes_in,
        }

    def _answered(self, steps: int, since: float) -> None:
        """A client's step of `steps` env steps was answered, `since` (perf_counter) was when it began."""
        self.total_steps += steps
        if self._measuring:
            self._latencies.append(time.perf_counter() - since)
            self._steps += steps

    def _first_answer(self) -> None:
        self._answered_once += 1
        if self._answered_once == self.clients:
            self.ready.set()

    async def local_client(self, index: int) -> None:
        """One env client acting itself (local inference) until stopping; its vector steps are timed."""
        last = {"steps": 0, "at": time.perf_counter()}

        def stepped(stats: ClientStats) -> None:
            if not last["steps"]:
                self._first_answer()
            self._answered(stats.env_steps - int(last["steps"]), last["at"])
            last.update(steps=stats.env_steps, at=time.perf_counter())

        assert self.local_spool is not None
        client = EnvClient(
            make_env(self.envs, real=True),  # a gymnasium vector env, as EnvClient takes
            self.target,
            client_id=f"bench-{os.getpid()}-{index}",
            inference="local",
            spool_dir=self.local_spool,
            backend=self.local_backend,
            on_step=stepped,
            connect_timeout_s=30,
        )
        stopper = asyncio.create_task(self._stop_when_stopping(client))
        try:
            await client.run()
        finally:
            stopper.cancel()

    async def _stop_when_stopping(self, client: EnvClient) -> None:
        while not self.stopping:
            await asyncio.sleep(0.05)
        client.stop()

    async def client(self, _index: int) -> None:
        """One env client: hello, then step messages until stopping, then close."""
        async with grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS) as channel:
            call = channel.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)()
            await call.write(self._hello)
            await _read(call)
            env = self.make_env()
            obs, _ = env.reset()
            reward, terminated = np.zeros(self.envs, np.float32), np.zeros(self.envs, bool)
            truncated = terminated
            resetting = np.ones(self.envs, bool)  # rows of the next message that are reset observations
            ended = np.zeros(self.envs, bool)  # sub-envs whose episode ended in the last env step
            first = True
            while not self.stopping:
                message = step_message(obs, reward, terminated, truncated).SerializeToString()
                sent = time.perf_counter()
                await call.write(message)
                raw = await _read(call)
                reply = pb.ServerMessage.FromString(raw)
                self._answered(self.envs - int(resetting.sum()), sent)
                if self._measuring:
                    self._bytes_out += len(message)
                    self._bytes_in += len(raw)
                if first:
                    first = False
                    self._first_answer()
                actions = codec.from_value(reply.actions.actions, "actions")
                obs, reward, terminated, truncated, _ = env.step(actions)
                resetting, ended = ended, terminated | truncated  # NEXT_STEP: resets come one step later
            await call.write(pb.ClientMessage(close=pb.Close()).SerializeToString())
            await call.done_writing()
            await call.code()


def _spec_envs(path: Path, envs: int) -> Callable[[], gym.vector.VectorEnv]:
    """A maker of the vector env of `envs` sub-envs of the run spec in `path`, made as `rlgate env` makes it."""
    if envs < 2:
        raise SystemExit("--spec needs --envs 2 or more: a vector env")
    spec = RunSpec.load(path)
    imports = ImportPolicy(spec.modules())

    def make() -> gym.vector.VectorEnv:
        env = make_spec_env(spec.env, imports, envs)
        assert isinstance(env, gym.vector.VectorEnv)  # envs >= 2
        return env

    return make


def _single_spaces(env: gym.vector.VectorEnv | SyntheticCartPole) -> tuple[gym.Space, gym.Space]:
    assert isinstance(env, gym.vector.VectorEnv)  # a run spec's env (`_spec_envs`)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


async def _read(call: grpc.aio.StreamStreamCall) -> bytes:
    raw = await call.read()
    if raw is grpc.aio.EOF:
        raise RuntimeError(f"server ended the stream: {await call.code()} {await call.details()}")
    return raw


def _exit_on_failure(task: asyncio.Task) -> None:
    """A failed client makes the whole process fail at once, so the bench sees it instead of waiting."""
    if not task.cancelled() and task.exception() is not None:
        traceback.print_exception(task.exception(), file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)


async def run(
    target: str,
    clients: int,
    envs: int,
    real_envs: bool,
    spec: Path | None,
    local_spool: Path | None,
    local_backend: Backend,
) -> None:
    load = LoadGenerator(target, clients, envs, real_envs, spec, local_spool, local_backend)
    client = load.client if local_spool is None else load.local_client
    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    for task in tasks:
        task.add_done_callback(_exit_on_failure)
    await load.ready.wait()
    print("ready", flush=True)
    while (command := (await asyncio.to_thread(sys.stdin.readline)).strip()) not in ("stop", ""):
        if command == "measure":
            load.begin_window()
            print("measuring", flush=True)
        elif command == "report":
            print(json.dumps(load.end_window()), flush=True)
    load.stopping = True
    await asyncio.gather(*tasks)
    print(json.dumps({"total_steps": load.total_steps}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.load", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of the policy server")
    parser.add_argument("--clients", type=int, default=1, help="env clients (streams) in this process")
    parser.add_argument("--envs", type=int, default=1, help="sub-envs per client (rows per message)")
    parser.add_argument("--real-envs", action="store_true", help="gymnasium's CartPole-v1 instead of numpy's")
    parser.add_argument("--spec", type=Path, help="the env of this run spec file (real envs, its wrappers)")
    parser.add_argument(
        "--local-spool", type=Path, metavar="DIR", help="clients act themselves (local inference), spooling here"
    )
    parser.add_argument(
        "--local-backend", choices=get_args(Backend), default="torch", help="what runs the local clients' forward pass"
    )
    args = parser.parse_args()
    asyncio.run(
        run(args.target, args.clients, args.envs, args.real_envs, args.spec, args.local_spool, args.local_backend)
    )


if __name__ == "__main__":
    main()
