"""Processes a test started, as Linux's /proc sees them: which are below one, and whether they still run."""

from __future__ import annotations

import asyncio
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc: children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """Alive, and not a zombie (a dead process whose exit status nobody collected yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def all_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    """The pids still running after up to `timeout` s (a process may take a moment to see its parent go)."""
    try:
        async with asyncio.timeout(timeout):
            while any(running(pid) for pid in pids):
                await asyncio.sleep(0.05)
    except TimeoutError:
        pass
    return {pid for pid in pids if running(pid)}
