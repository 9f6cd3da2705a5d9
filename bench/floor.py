"""The bare floor: the least a Python gRPC policy server must do for the same load, to compare rlgate to.

A grpc.aio server with the same `Connect` stream, so the same load clients drive it: raw bytes in,
the observations decoded as arrays (no validation), one forward pass of the same default model over
every request that has arrived (greedy batching across streams, up to `max_batch_size` rows, on the
event loop itself: no thread hand-off; a lone stream's at once, in its own task), actions sampled, raw
bytes out. No episodes, no connectors, no metrics. It answers a hello with a welcome and ends a stream
on close.

With `--transport-only` it is the transport floor instead: each step message is parsed and answered at
once with zero actions serialized once per env count, with no model and no batching. What that costs is
what Python gRPC, protobuf and the event loop cost on the machine, below which no goal can be met.
Run: `python -m rlgate.bench.floor --port 0 [--transport-only]`; logs `serving grpc=HOST:PORT` like `rlgate serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections import deque

import grpc
import numpy as np
import torch

from rlgate.bench.cartpole import spaces
from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.models import build_module
from rlgate.v1 import policy_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME = "rlgate.v1.PolicyService"
WELCOME = pb.ServerMessage(welcome=pb.Welcome(session_id="floor", model_version=0)).SerializeToString()


class FloorServer:
    """Greedy batches of whole requests, one forward each, answered in arrival order."""

    def __init__(self, max_batch_size: int, transport_only: bool = False) -> None:
        torch.manual_seed(0)
        observation_space, action_space = spaces()
        self.module = build_module(observation_space, action_space).eval()
        self.dist_cls = self.module.get_exploration_action_dist_cls()
        self.max_batch_size = max_batch_size
        self.transport_only = transport_only
        self._replies: dict[int, bytes] = {}
        self._queue: deque[tuple[np.ndarray, asyncio.Future]] = deque()
        self._wakeup = asyncio.Event()
        self._streams = 0  # open streams

    async def connect(self, _requests: object, context: grpc.aio.ServicerContext) -> None:
        self._streams += 1
        try:
            while (raw := await context.read()) is not grpc.aio.EOF:
                message = pb.ClientMessage.FromString(raw)
                kind = message.WhichOneof("kind")
                if kind == "hello":
                    await context.write(WELCOME)
                elif kind == "step" and self.transport_only:
                    await context.write(self._fixed_reply(message.step.obs.tensor.shape[0]))
                elif kind == "step":
                    actions = await self._compute(codec.from_value(message.step.obs))
                    reply = pb.ServerMessage(actions=pb.Actions(actions=codec.to_value(actions)))
                    await context.write(reply.SerializeToString())
                else:
                    return
        finally:
            self._streams -= 1

    async def _compute(self, obs: np.ndarray) -> np.ndarray:
        """A lone stream's step at once (no other could join its batch, as rlgate's Batcher does), else
        through the queue."""
        if self._streams == 1 and not self._queue:
            return self._actions(obs)
        future = asyncio.get_running_loop().create_future()
        self._queue.append((obs, future))
        self._wakeup.set()
        return await future

    async def batch_forever(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                taken = [self._queue.popleft()]
                rows = len(taken[0][0])
                while self._queue and rows + len(self._queue[0][0]) <= self.max_batch_size:
                    taken.append(self._queue.popleft())
                    rows += len(taken[-1][0])
                actions = self._actions(np.concatenate([obs for obs, _ in taken]))
                start = 0
                for obs, future in taken:
                    future.set_result(actions[start : start + len(obs)])
                    start += len(obs)
                await asyncio.sleep(0)  # let the streams whose messages arrived meanwhile queue them

    def _fixed_reply(self, rows: int) -> bytes:
        """Zero actions for `rows` envs, serialized once per env count (the transport floor's answer)."""
        reply = self._replies.get(rows)
        if reply is None:
            actions = pb.Actions(actions=codec.to_value(np.zeros(rows, np.int64)))
            reply = self._replies[rows] = pb.ServerMessage(actions=actions).SerializeToString()
        return reply

    def _actions(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits = self.module.forward_exploration({Columns.OBS: torch.from_numpy(obs)})[Columns.ACTION_DIST_INPUTS]
            return self.dist_cls.from_logits(logits).sample().numpy()


async def serve(host: str, port: int, max_batch_size: int, transport_only: bool) -> None:
    floor = FloorServer(max_batch_size, transport_only)
    server = grpc.aio.server()
    connect = grpc.stream_stream_rpc_method_handler(floor.connect)  # no (de)serializers: raw bytes
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE_NAME, {"Connect": connect})])
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    batcher = asyncio.create_task(floor.batch_forever())
    log.info("serving grpc=%s:%d", host, bound)
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop(1.0)
    batcher.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--transport-only", action="store_true", help="answer without a model (see above)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(args.host, args.port, args.max_batch_size, args.transport_only))


if __name__ == "__main__":
    main()
