"""IdleWatch: only a read (or write) that waits its whole timeout ends the stream; time spent between never does."""

import asyncio
import time

import pytest

from rlgate.server.idle import IdleWatch

IDLE_S = 0.1


async def read(idle: IdleWatch, seconds: float) -> None:
    """A read that takes `seconds` (a client that answers after that long)."""
    idle.waiting_since = idle.now()
    await asyncio.sleep(seconds)
    idle.waiting_since = None


async def test_a_read_that_waits_the_timeout_raises_timeout_error_soon_after() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with IdleWatch(IDLE_S) as idle:
            await read(idle, 0.01)
            await read(idle, 10.0)
    assert IDLE_S <= time.monotonic() - started < 2.0


async def test_work_between_reads_longer_than_the_timeout_is_not_idleness() -> None:
    """A step that waits long for its batch (a paused server, a slow model) is not a silent client."""
    async with IdleWatch(IDLE_S) as idle:
        for _ in range(3):
            await asyncio.sleep(IDLE_S * 2.5)  # between reads
            await read(idle, IDLE_S / 4)


async def test_reads_each_shorter_than_the_timeout_never_expire_however_long_the_stream() -> None:
    async with IdleWatch(IDLE_S) as idle:
        for _ in range(12):  # 0.6 s in all: the check fires and re-arms several times
            await read(idle, IDLE_S / 2)


async def test_leaving_the_block_stops_the_watch() -> None:
    async with IdleWatch(IDLE_S) as idle:
        idle.waiting_since = idle.now()  # left waiting: the watch must not fire after the block
    await asyncio.sleep(IDLE_S * 3)  # raises CancelledError here if the watch still ran against this task
