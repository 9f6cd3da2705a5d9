"""`rlgate` as a real process, run to its end."""

from __future__ import annotations

import asyncio
import sys

RLGATE = (sys.executable, "-m", "rlgate")


async def rlgate(*args: str, timeout: float = 120) -> tuple[int, str]:
    """Run `rlgate ARGS` to its end; (exit status, stderr)."""
    process = await asyncio.create_subprocess_exec(
        *RLGATE, *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, stderr.decode()
