"""`rlgate` as a real process, run to its end: forked by this test worker's warm `rlgate` (tests/support/warm.py),
so it starts without importing torch again."""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from pathlib import Path

from tests.support import warm

RLGATE = (sys.executable, "-m", "rlgate")
ROOT = Path(__file__).resolve().parents[2]  # the default working directory: `tests.support...` paths resolve
# At most this many `rlgate` processes at once per event loop: a test gathering fifty of them would otherwise run
# fifty commands (many importing their user's code or starting services) on two cores at once, and their timeouts
# would measure the crowd.
AT_ONCE = 2 * (os.cpu_count() or 1)
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


async def rlgate(*args: str, timeout: float = 120, cwd: Path = ROOT) -> tuple[int, str]:
    """Run `rlgate ARGS` in `cwd` to its end (within `timeout` seconds from its start); (exit status, stderr)."""
    slots = _slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(AT_ONCE))
    async with slots:
        code, _, stderr = await warm.run_async(list(args), cwd, timeout)
    return code, stderr
