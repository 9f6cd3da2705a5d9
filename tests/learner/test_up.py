"""`rlgate up` end to end: CartPole learns to a return of 150, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rlgate.spec import checkpoint

UP = [sys.executable, "-m", "rlgate", "up", "--env", "CartPole-v1", "--seed", "0"]


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


@pytest.fixture
async def up(tmp_path: Path) -> AsyncIterator:
    """up(*args): `rlgate up` in its own session, output piped; killed with its group at teardown if needed."""
    processes: list[asyncio.subprocess.Process] = []

    async def start(*args: str) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            *UP,
            "--run-dir",
            str(tmp_path),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def all_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    """The pids still running after up to `timeout` s (a process may take a moment to see its parent go)."""
    try:
        async with asyncio.timeout(timeout):
            while any(running(pid) for pid in pids):
                await asyncio.sleep(0.05)
    except TimeoutError:
        pass
    return {pid for pid in pids if running(pid)}


@pytest.mark.slow
async def test_up_trains_cartpole_to_the_stop_return_and_ends_every_process(up, tmp_path):
    process = await up("--stop-return", "150", "--max-steps", "20000")
    async with asyncio.timeout(120):
        head = await process.stdout.readuntil(b"model v")  # the first progress line: every process is up
        children = descendants(process.pid)
        rest, _ = await process.communicate()
    output = (head + rest).decode()
    assert process.returncode == 0, output
    last = output.strip().splitlines()[-1]
    match = re.fullmatch(r"reached return (\S+) at (\d+) env steps in (\S+) s", last)
    assert match, last
    assert float(match[1]) >= 150 and int(match[2]) <= 20000
    assert len(children) >= 3  # learner, server, env clients (and the clients' own processes)
    assert not await all_gone(children)
    (run_dir,) = tmp_path.glob("CartPole-v1-*")
    assert checkpoint.latest(run_dir / "checkpoints") is not None  # the learner's final checkpoint
    assert list(run_dir.glob("events.out.tfevents.*")) and (run_dir / "progress.csv").exists()  # the experiment log


@pytest.mark.slow
async def test_ctrl_c_stops_up_and_every_process_it_started(up, tmp_path):
    process = await up("--stop-return", "500", "--max-steps", "1000000")
    async with asyncio.timeout(120):
        await process.stdout.readuntil(b"model v")
        children = descendants(process.pid)
        # SIGINT to `up` alone (a terminal's Ctrl-C reaches the whole group): up itself must end its children.
        process.send_signal(signal.SIGINT)
        rest, _ = await process.communicate()
    output = rest.decode()
    assert process.returncode == 130, output
    assert "Ctrl-C: shutting down" in output and "stopped at return" in output
    assert len(children) >= 3
    assert not await all_gone(children), "processes left running after Ctrl-C"
