"""IdleWatch: ends a stream that waits on its client too long, at the cost of two attribute writes per wait.

A stream waits on its client while it reads the client's next message, and while it writes an answer the client
does not take (HTTP/2 flow control: a client that reads no answers leaves the server's write pending for ever).
`asyncio.timeout()` around every read and write schedules a timer and cancels it again, per message: ~7 us on a
2-core machine, a third of a lone client's forward pass. Instead one timer per stream looks, when it
fires, whether the stream is waiting and since when: a wait of `seconds` is cancelled (through an
`asyncio.Timeout` spanning the stream, so it ends as TimeoutError there, as asyncio.timeout would end it),
otherwise the timer is set again for when the current wait would expire.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class IdleWatch:
    """`async with IdleWatch(s) as idle:` around a stream's loop; `idle.waiting_since = loop time` before each read
    or write, None after it. The block raises TimeoutError once one has waited `s` seconds."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.waiting_since: float | None = None
        self._loop = asyncio.get_running_loop()
        self._timeout = asyncio.timeout(None)
        self._check_handle: asyncio.TimerHandle | None = None

    def now(self) -> float:
        """The event loop's clock, which `waiting_since` is read against."""
        return self._loop.time()

    async def __aenter__(self) -> IdleWatch:
        await self._timeout.__aenter__()
        self._check_handle = self._loop.call_later(self.seconds, self._check)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._check_handle is not None:
            self._check_handle.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)  # raises TimeoutError, or lets the exception through

    def _check(self) -> None:
        now, since = self._loop.time(), self.waiting_since
        if since is not None and now - since >= self.seconds:
            self._check_handle = None
            self._timeout.reschedule(now)  # expires at once: cancels the stream's task, raised as TimeoutError
        else:
            self._check_handle = self._loop.call_at((now if since is None else since) + self.seconds, self._check)
