"""`rlgate up` end to end: CartPole learns to a return of 150, and Ctrl-C in a terminal stops every process in
order (clients, server, learner), promptly, leaving none behind."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import os
import pty
import re
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.processes import all_gone, descendants

from rlgate.storage import checkpoint

UP = [sys.executable, "-m", "rlgate", "up", "--env", "CartPole-v1", "--seed", "0"]


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


@pytest.mark.slow
@pytest.mark.parametrize("inference", ["server", "local"])
async def test_up_trains_cartpole_to_the_stop_return_and_ends_every_process(up, tmp_path, inference):
    process = await up("--stop-return", "150", "--max-steps", "20000", "--inference", inference, "--device", "auto")
    async with asyncio.timeout(120):
        head = await process.stdout.readuntil(b"model v")  # the first progress line: every process started
        children = descendants(process.pid)
        learner = [args for args in map(command_line, children) if args[:2] == ["rlgate", "learn"]]
        rest, _ = await process.communicate()
    output = (head + rest).decode()
    assert process.returncode == 0, output
    assert "\r" not in output  # not a terminal: plain progress lines, no carriage-return runs
    last = output.strip().splitlines()[-1]
    match = re.fullmatch(r"reached return (\S+) at (\d+) env steps in (\S+) s", last)
    assert match, last
    assert float(match[1]) >= 150 and int(match[2]) <= 20000
    assert len(children) >= 3  # learner, server, env clients (and the clients' own processes)
    (args,) = learner
    assert args[args.index("--device") + 1] == "auto"  # up's --device is the learner's
    assert not await all_gone(children)
    (run_dir,) = tmp_path.glob("CartPole-v1-*")
    assert checkpoint.latest(run_dir / "checkpoints") is not None  # the learner's final checkpoint
    assert list(run_dir.glob("events.out.tfevents.*")) and (run_dir / "progress.csv").exists()  # the experiment log
    assert not list((run_dir / "spool").rglob("*.pb"))  # the server's spool, and a local client's, were drained


def command_line(pid: int) -> list[str]:
    """A process's command line as ps shows it, split (`up`'s children name themselves `rlgate learn ...`); none if
    it has ended."""
    try:
        shown = Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0")
    except (FileNotFoundError, ProcessLookupError):
        return []
    return shown.split("\0") if "\0" in shown else shlex.split(shown)


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
        # The bar with ended episodes counted: every process is up (the clients start once the server is ready).
        shown = await asyncio.to_thread(read_until, master, b" episodes)", 120)
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


# A stage of `up`'s run, by the line it prints as it begins -> the child it then waits on (None: none).
WAITS_ON = {
    b"rlgate up: ": "serve",  # the server's readiness
    b"env steps ": None,  # training: the first progress line
    b"stopping the env clients": "env",
    b"stopping the server": "serve",
    b"stopping the learner": "learn",
}


def child(pid: int, command: str) -> int | None:
    """The pid of `up`'s `rlgate COMMAND` child, if it runs."""
    for found in descendants(pid):
        if command_line(found)[:2] == ["rlgate", command]:
            return found
    return None


async def signalled(process: asyncio.subprocess.Process, stages: dict[bytes, signal.Signals]) -> tuple[str, set[int]]:
    """Read `up`'s output to its end, signalling it at each stage: at the first line that begins with a stage's
    marker, send that stage's signal while `up` surely waits on the child the stage names (held stopped
    meanwhile, SIGSTOP then SIGCONT). Returns the output and every process `up` started."""
    output, started, left = b"", set(), dict(stages)
    async with asyncio.timeout(180):
        while line := await process.stdout.readline():
            output += line
            started |= descendants(process.pid)
            marker = next((m for m in left if line.startswith(m)), None)
            if marker is None:
                continue
            held = child(process.pid, WAITS_ON[marker]) if WAITS_ON[marker] else None
            if held is not None:
                os.kill(held, signal.SIGSTOP)
            process.send_signal(left.pop(marker))
            if held is not None:  # up may have killed it meanwhile (its grace period over, on a slow machine)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(held, signal.SIGCONT)
        await process.wait()
    return output.decode(errors="replace"), started


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "stages", "code", "said"),
    [
        pytest.param(
            ("--stop-return", "15"),
            {b"stopping the env clients": signal.SIGTERM, b"stopping the server": signal.SIGINT},
            0,
            "reached return",
            id="goal-then-signals-while-stopping",
        ),
        pytest.param(
            ("--stop-return", "1000", "--max-steps", "1000000"),
            {
                b"env steps ": signal.SIGINT,
                b"stopping the server": signal.SIGINT,
                b"stopping the learner": signal.SIGTERM,
            },
            130,
            "Ctrl-C: shutting down",
            id="ctrl-c-then-signals-while-stopping",
        ),
        pytest.param(
            ("--stop-return", "1000"),
            {b"rlgate up: ": signal.SIGTERM, b"stopping the learner": signal.SIGHUP},
            143,
            "SIGTERM: shutting down",
            id="sigterm-waiting-for-the-server",
        ),
    ],
)
async def test_signals_at_every_stage_end_up_in_order_with_no_traceback_and_no_process_left(
    up, tmp_path, args, stages, code, said
):
    """Ctrl-C, SIGTERM or a hang-up while `up` waits for the server, trains or stops each child (the goal reached,
    or after a first signal): it goes on stopping the children in order, each within its grace period; no
    traceback, and nothing it started outlives it."""
    process = await up(*args)
    output, started = await signalled(process, stages)
    assert process.returncode == code, output
    assert said in output and "Traceback" not in output, output
    stopping = [line for line in output.splitlines() if line.startswith("stopping the ")]
    assert stopping == [f"stopping the {c}" for c in ("env clients", "server", "learner") if c in " ".join(stopping)]
    assert stopping[-2:] == ["stopping the server", "stopping the learner"], output
    assert len(started) >= 2 and not await all_gone(started), "processes left running"
    (run_dir,) = tmp_path.glob("CartPole-v1-*")
    if b"rlgate up: " in stages:  # before the server was ready: no env client started (the learner may not have)
        assert not (run_dir / "envs.log").exists()
    else:
        assert "stopped; final checkpoint" in (run_dir / "learner.log").read_text()  # not killed: it stopped in time


@pytest.mark.slow
async def test_up_reports_the_servers_own_start_up_error_however_long_the_server_takes(up, tmp_path, monkeypatch):
    """On a loaded machine the server may take longer to start (and fail) than an env client waits to connect:
    `up` starts the clients only once the server is ready, so its error is the server's own. Here the server is
    held stopped for a while (the load), and the clients would give up connecting after 50 ms. Forked from `up`'s
    fork server, the server can fail within milliseconds of starting: where the test finds it gone already (a
    loaded machine), it is not held, and the outcome must be the same."""
    monkeypatch.setenv("RLGATE_MAX_BATCH_SIZE", "0")  # only the server reads it: its start-up error
    monkeypatch.setenv("RLGATE_CONNECT_TIMEOUT_S", "0.05")  # only the env clients read it
    process = await up("--stop-return", "1000")
    server = None
    async with asyncio.timeout(60):
        while process.returncode is None and (server := child(process.pid, "serve")) is None:
            await asyncio.sleep(0.005)
    if server is not None:
        with contextlib.suppress(ProcessLookupError):  # it failed between the look and the signal
            os.kill(server, signal.SIGSTOP)
        try:
            with contextlib.suppress(TimeoutError):  # as long as an env client takes to give up, or 3 s if none runs
                async with asyncio.timeout(3):
                    while (log := next(tmp_path.glob("*/envs.log"), None)) is None or "rlgate: " not in log.read_text():
                        await asyncio.sleep(0.05)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGCONT)
    async with asyncio.timeout(60):
        output = (await process.stdout.read()).decode()
        await process.wait()
    assert process.returncode == 2, output
    assert output.strip().splitlines()[-1] == (
        "rlgate: server: --max-batch-size: input should be greater than or equal to 1 (got '0')"
    )


@pytest.mark.slow
async def test_up_killed_outright_leaves_no_process_running(up):
    """SIGKILL cannot be handled: the children get SIGTERM when `up` dies (Linux) and stop on their own."""
    process = await up("--stop-return", "1000", "--max-steps", "1000000")
    async with asyncio.timeout(120):
        await process.stdout.readuntil(b"model v")  # the first progress line: every process started
    started = descendants(process.pid)
    process.kill()
    await process.wait()
    assert len(started) >= 3 and not await all_gone(started, timeout=30), "processes left running"
