"""`rlgate` as a real process, run to its end."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

RLGATE = (sys.executable, "-m", "rlgate")
ROOT = Path(__file__).resolve().parents[2]  # the default working directory: `tests.support...` paths resolve


async def rlgate(*args: str, timeout: float = 120, cwd: Path = ROOT) -> tuple[int, str]:
    """Run `rlgate ARGS` in `cwd` to its end; (exit status, stderr)."""
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
