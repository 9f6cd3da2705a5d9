"""What an env client's connection to its server is, whether the server acts for it or it acts itself.

The channel (options, TLS), waiting for it to connect, the status codes after which a new stream may well succeed,
the errors `EnvClient.run()` ends with, and the stats it keeps (`ClientStats`, tallied per vector step by `Tally`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass, field

import grpc
import numpy as np

from rlgate.core.errors import UserError
from rlgate.service.channel import CHANNEL_OPTIONS as RECONNECT_AND_KEEPALIVE

log = logging.getLogger(__name__)

# Codes after which a fresh stream may well succeed; any other error is the client's to fix.
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


def no_model_yet(error: grpc.aio.AioRpcError) -> bool:
    """The server has no model yet (UNAVAILABLE, "no model yet: ..." in proto/README's contract): what a client
    meets while a run starts, before the learner's first weights; not a fault."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and (error.details() or "").startswith("no model yet")


# A target like dns:///inference:50051 resolves to every replica; round_robin spreads streams over them
# (each stream, once open, stays on its replica, so its episodes never move). Each client has a connection
# of its own (gRPC would share one between a process's channels to one target): a server's workers, which
# share its port, get connections spread over them by the kernel, not streams.
CHANNEL_OPTIONS = (
    ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", 256 << 20),  # a large model's weights (local inference)
    *RECONNECT_AND_KEEPALIVE,
)
# While the server is unreachable, one warning after this long, not one per attempt.
WARN_AFTER_S = 1.0


class ServerRefused(UserError):
    """The server ended the stream with a status that a new stream would get too: the client's to fix."""

    def __init__(self, target: str, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"the server at {target} refused the stream: {code.name}: {details}")
        self.code = code
        self.details = details


class ServerUnreachable(UserError):
    """No connection to the server within the client's connect timeout."""


@dataclass
class ClientStats:
    """What a client did so far."""

    env_steps: int = 0
    episodes: int = 0
    reconnects: int = 0  # after a broken stream
    handovers: int = 0  # new streams the server asked for at an episode boundary (Actions.reconnect)
    model_version: int = -1
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    paused: str | None = None  # local inference: why the client does not sample now (the learner's pace)
    backend: str | None = None  # local inference: what runs the forward pass ("torch" or "onnxruntime")

    def mean_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None


class Tally:
    """Counts a vector env's steps into `stats`: env steps (a sub-env's reset is none), finished episodes and
    their returns, with gymnasium's NEXT_STEP autoreset (a sub-env's step after its episode ended only resets it)."""

    def __init__(self, stats: ClientStats, num_envs: int) -> None:
        self.stats = stats
        self._returns = np.zeros(num_envs)
        self._resetting = np.zeros(num_envs, bool)  # sub-envs whose next env.step() only resets them

    def step(self, rewards: np.ndarray, terminateds: np.ndarray, truncateds: np.ndarray) -> None:
        stats, returns = self.stats, self._returns
        returns += rewards
        stats.env_steps += int(len(returns) - self._resetting.sum())  # transitions; a reset is not an env step
        resetting = self._resetting = terminateds | truncateds
        stats.returns.extend(returns[resetting].tolist())
        returns[resetting] = 0.0
        stats.episodes += int(resetting.sum())


def channel_to(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    """A channel of the client's own to the server (`CHANNEL_OPTIONS`), over TLS with `credentials`."""
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


async def connected(channel: grpc.aio.Channel, target: str, stopped: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until the channel connects (True) or `stopped` is set (False); ServerUnreachable after `timeout_s`."""
    ready = asyncio.ensure_future(channel.channel_ready())
    stopping = asyncio.ensure_future(stopped.wait())
    waiting = {ready, stopping}
    try:
        async with asyncio.timeout(timeout_s):
            done, _ = await asyncio.wait(waiting, timeout=WARN_AFTER_S, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                limit = "" if timeout_s is None else f" for up to {timeout_s:g} s"
                log.warning("server at %s not reachable yet; trying%s", target, limit)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        raise ServerUnreachable(f"cannot reach the server at {target} within {timeout_s:g} s") from None
    finally:
        for future in waiting:
            future.cancel()
    return ready in done
