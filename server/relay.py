"""WeightsRelay: the weights local-inference clients act with, as this server got them.

A server with a learner relays each version the learner publishes to it (the same `Weights` message: run spec,
spaces, safetensors, connector state); a server that serves a policy of its own (a checkpoint, a fresh model, the
version 0 it builds from the learner's run spec before the learner's first weights) relays that policy's. Each
client watching gets the newest version above the one it has, then every newer one.

Pacing: the learner tells this server how many env steps it may hold unacknowledged (`window()`, its
`max_unacked_steps`); the relay shares that window among the clients watching (each message says a client's share),
as the learner shares its train batch among its servers. A window of 0 (no learner) is no limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from rlgate.v1 import learner_pb2


class WeightsRelay:
    """The newest Weights message to relay, and the clients watching for the next one."""

    def __init__(self, window: Callable[[], int] = lambda: 0) -> None:
        """`window()`: the env steps this server may hold unacknowledged now (0: no limit)."""
        self.weights: learner_pb2.Weights | None = None
        self.watchers = 0
        self._window = window
        self._published = asyncio.Condition()

    async def publish(self, weights: learner_pb2.Weights) -> None:
        """Relay `weights` from now on (a version not newer than the one relayed already is ignored)."""
        if self.weights is not None and weights.version <= self.weights.version:
            return
        async with self._published:
            self.weights = weights
            self._published.notify_all()

    async def after(self, version: int) -> AsyncIterator[learner_pb2.Weights]:
        """Every version newer than `version`, as it is relayed (the newest first, if newer already)."""
        self.watchers += 1
        try:
            while True:
                async with self._published:

                    def newer(v: int = version) -> bool:
                        return self.weights is not None and self.weights.version > v

                    await self._published.wait_for(newer)
                    weights = self.weights
                assert weights is not None
                version = weights.version
                yield self._with_share(weights)
        finally:
            self.watchers -= 1

    def _newer_than(self, version: int) -> bool:
        return self.weights is not None and self.weights.version > version

    def _with_share(self, weights: learner_pb2.Weights) -> learner_pb2.Weights:
        """`weights` saying this client's share of the server's window of unacknowledged env steps."""
        window = self._window()
        share = max(1, window // max(self.watchers, 1)) if window else 0
        if weights.max_unacked_steps == share:
            return weights
        shared = learner_pb2.Weights()
        shared.CopyFrom(weights)
        shared.max_unacked_steps = share
        return shared
