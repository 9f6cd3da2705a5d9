"""`rlgate` as a real process, run to its end."""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from pathlib import Path

RLGATE = (sys.executable, "-m", "rlgate")
ROOT = Path(__file__).resolve().parents[2]  # the default working directory: `tests.support...` paths resolve
# At most this many `rlgate` processes at once per event loop: a test gathering fifty of them would otherwise start
# fifty Python start-ups (each importing torch) on two cores at once, and their timeouts would measure the crowd.
AT_ONCE = 2 * (os.cpu_count() or 1)
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


async def rlgate(*args: str, timeout: float = 120, cwd: Path = ROOT) -> tuple[int, str]:
    """Run `rlgate ARGS` in `cwd` to its end (within `timeout` seconds from its start); (exit status, stderr)."""
    slots = _slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(AT_ONCE))
    async with slots:
        return await _run(args, timeout, cwd)


async def _run(args: tuple[str, ...], timeout: float, cwd: Path) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *RLGATE,
        *args,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, stderr.decode()
