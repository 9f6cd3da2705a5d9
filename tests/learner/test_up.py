"""`rlgate up` end to end: CartPole learns to a return of 150, and Ctrl-C in a terminal stops every process in
order (clients, server, learner), promptly, leaving none behind."""

from __future__ import annotations

import asyncio
import datetime
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
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
@pytest.mark.parametrize("inference", ["server", "local"])
async def test_up_trains_cartpole_to_the_stop_return_and_ends_every_process(up, tmp_path, inference):
    process = await up("--stop-return", "150", "--max-steps", "20000", "--inference", inference)
    async with asyncio.timeout(120):
        head = await process.stdout.readuntil(b"model v")  # the first progress line: every process is up
        children = descendants(process.pid)
        rest, _ = await process.communicate()
    output = (head + rest).decode()
    assert process.returncode == 0, output
    assert "\r" not in output  # not a terminal: plain progress lines, no carriage-return runs
    last = output.strip().splitlines()[-1]
    match = re.fullmatch(r"reached return (\S+) at (\d+) env steps in (\S+) s", last)
    assert match, last
    assert float(match[1]) >= 150 and int(match[2]) <= 20000
    assert len(children) >= 3  # learner, server, env clients (and the clients' own processes)
    assert not await all_gone(children)
    (run_dir,) = tmp_path.glob("CartPole-v1-*")
    assert checkpoint.latest(run_dir / "checkpoints") is not None  # the learner's final checkpoint
    assert list(run_dir.glob("events.out.tfevents.*")) and (run_dir / "progress.csv").exists()  # the experiment log
    assert not list((run_dir / "spool").rglob("*.pb"))  # the server's spool, and a local client's, were drained


def read_until(fd: int, pattern: bytes, timeout: float) -> bytes:
    """Read a pty's output until `pattern` shows (or the pty closes); TimeoutError with what came, after `timeout`."""
    out, deadline = b"", time.monotonic() + timeout
    while pattern not in out:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(out.decode(errors="replace"))
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every process holding the terminal is gone
                break
            if not chunk:
                break
            out += chunk
    return out


def logged_at(log: Path, message: str) -> datetime.datetime:
    """When a process logged `message` first (the log line's asctime)."""
    for line in log.read_text().splitlines():
        if message in line:
            return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"{log.name} never logged {message!r}:\n{log.read_text()}")


@pytest.mark.slow
async def test_ctrl_c_in_a_terminal_stops_every_process_in_order_without_waiting_for_a_drain(tmp_path):
    """The terminal's Ctrl-C reaches the whole process group; up alone acts on it, stopping the others in order."""
    master, slave = pty.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
    # setsid --ctty: a session of its own with this pty as its controlling terminal, as a shell in a terminal gives.
    process = subprocess.Popen(
        ["setsid", "--ctty", *UP, "--run-dir", str(tmp_path), "--stop-return", "500", "--max-steps", "1000000"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    try:
        shown = await asyncio.to_thread(read_until, master, b"model v", 120)  # the bar: every process is up
        children = descendants(process.pid)
        os.write(master, b"\x03")  # Ctrl-C, typed
        interrupted = time.monotonic()
        shown += await asyncio.to_thread(read_until, master, b"stopped at return", 60)
        code = await asyncio.to_thread(process.wait, 30)
        took = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        os.close(master)
    output = shown.decode(errors="replace")
    assert code == 130, output
    assert "\r" in output and "step/s" in output  # tqdm's bar, on a terminal
    assert "Ctrl-C: shutting down" in output
    assert len(children) >= 3
    assert not await all_gone(children), "processes left running after Ctrl-C"
    (run_dir,) = tmp_path.glob("CartPole-v1-*")
    logs = {name: run_dir / f"{name}.log" for name in ("envs", "server", "learner")}
    assert "did not ack" not in logs["server"].read_text()  # the learner was still there to ack the last episodes
    clients_stopped = logged_at(logs["envs"], "Ctrl-C: stopping")
    server_stopping, server_stopped = (
        logged_at(logs["server"], m) for m in ("signal received", "INFO rlgate.server.main stopped")
    )
    learner_stopping = logged_at(logs["learner"], "signal received")
    assert clients_stopped <= server_stopping <= server_stopped <= learner_stopping
    assert took < 10, f"shutting down took {took:.1f} s"
