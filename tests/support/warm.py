"""A warm `rlgate`: one process per test worker that imports what `rlgate` commands import once, then forks a
child for each run, so a test's `rlgate ...` is a real process of its own without paying a Python start-up.

Importing torch, gymnasium, gRPC and FastAPI costs ~3 CPU-s per process here; the user-error tests alone start
seventy `rlgate` processes. A child is forked before anything but imports happened (no thread, no event loop, no
gRPC object, no CUDA), takes the caller's stdin/stdout/stderr (passed over a Unix socket), working directory,
environment and arguments, and runs `rlgate.cli.main.main` as `python -m rlgate` would, exit status included.
Only what `python -m rlgate` does before `main` differs: the imports are already done. Tests that check what a
command imports, or how a process starts, start `python -m rlgate` themselves.

`run` and `run_async` start one; the warm process itself runs as `python -m tests.support.warm SOCKET`: it prints
`ready` once listening and exits when its stdin closes (the test worker that started it ended, however it ended).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import importlib.util
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path
from typing import IO

# Imported before any fork: what the commands' heavy paths import (each child then imports only the rest).
PRELOAD = (
    "torch",
    "gymnasium",
    "grpc",
    "fastapi",
    "uvicorn",
    "rlgate.cli.main",
    "rlgate.server.main",
    "rlgate.learner.main",
    "rlgate.client.main",
    "rlgate.cli.up",
)
MAX_REQUEST_BYTES = 1 << 20
START_TIMEOUT_S = 120
KILLED_TIMEOUT_S = 30  # a SIGKILLed run is reaped at once; bounded all the same
ROOT = Path(__file__).resolve().parents[2]
_warm: tuple[subprocess.Popen, str] | None = None  # this worker's warm process and its socket


class Process:
    """One `rlgate ARGS` forked by this worker's warm process, with the part of `subprocess.Popen`'s interface the
    tests use (pid, returncode, poll, wait, send_signal, terminate, kill). stdin is /dev/null; stdout and stderr
    go to the given files (an open file or a descriptor), as Popen's would."""

    def __init__(
        self,
        args: list[str],
        stdout: IO | int,
        stderr: IO | int,
        cwd: Path = ROOT,
        env: dict[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        request = {
            "args": args,
            "cwd": str(cwd),
            "env": dict(os.environ if env is None else env),
            "new_session": new_session,
        }
        fds = [out if isinstance(out, int) else out.fileno() for out in (stdout, stderr)]
        self.args, self.new_session = ["rlgate", *args], new_session
        self.returncode: int | None = None
        self._answer = b""  # the exit status line, as far as it came
        self._connection = socket.socket(socket.AF_UNIX)
        with open(os.devnull, "rb") as stdin:
            self._connection.connect(_socket())
            socket.send_fds(self._connection, [json.dumps(request).encode()], [stdin.fileno(), *fds])
        self.pid = int(_line(self._connection))

    def poll(self) -> int | None:
        """Its exit status if it ended, else None, without waiting."""
        if self.returncode is None:
            self._connection.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                self._read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, once it ended; subprocess.TimeoutExpired after `timeout` seconds."""
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                self._read()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
        return self.returncode  # type: ignore[return-value]

    async def wait_async(self) -> int:
        """`wait` for an event loop (bound it with asyncio.timeout)."""
        loop = asyncio.get_running_loop()
        self._connection.setblocking(False)
        while self.returncode is None:
            self._take(await loop.sock_recv(self._connection, 1))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal it (its session too, if it leads one) unless it has ended."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it is ending this moment
                if self.new_session:
                    os.killpg(self.pid, sig)
                else:
                    os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self) -> None:
        while self.returncode is None:
            self._take(self._connection.recv(1))

    def _take(self, byte: bytes) -> None:
        if not byte:
            raise RuntimeError(f"the warm rlgate exited before its run {self.pid} ended")
        self._answer += byte
        if byte == b"\n":
            self.returncode = int(self._answer)
            self._connection.close()


def run(
    args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None, new_session: bool = False
) -> tuple[int, str, str]:
    """`rlgate ARGS` in `cwd` to its end; (exit status, stdout, stderr). When `timeout` seconds pass it is killed
    (its whole session if `new_session`) and TimeoutError raised."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = Process(args, stdout, stderr, cwd=cwd, env=env, new_session=new_session)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(KILLED_TIMEOUT_S)
            raise TimeoutError(f"rlgate {' '.join(args)} ran past {timeout} s") from None
        return code, *_read_back(stdout, stderr)


async def run_async(args: list[str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    """`run` for an event loop: the loop goes on while the process runs."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = Process(args, stdout, stderr, cwd=cwd)
        try:
            async with asyncio.timeout(timeout):
                code = await process.wait_async()
        except TimeoutError:
            process.kill()
            async with asyncio.timeout(KILLED_TIMEOUT_S):
                await process.wait_async()
            raise
        return code, *_read_back(stdout, stderr)


def _read_back(*files: IO[bytes]) -> tuple[str, ...]:
    for file in files:
        file.seek(0)
    return tuple(file.read().decode() for file in files)


def _line(connection: socket.socket) -> bytes:
    """One line from the warm process, read a byte at a time: nothing after it is taken from the socket."""
    line = b""
    while not line.endswith(b"\n") and (byte := connection.recv(1)):
        line += byte
    return line


def _socket() -> str:
    """The socket of this worker's warm process, started on first use (a few seconds: its imports)."""
    global _warm
    if _warm is None or _warm[0].poll() is not None:
        folder = tempfile.mkdtemp(prefix="rlgate-warm-")
        path = os.path.join(folder, "socket")
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.warm", path], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        atexit.register(_stop, process, folder)
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
        line = process.stdout.readline() if ready else b""  # type: ignore[union-attr]
        if line != b"ready\n":
            _stop(process, folder)
            raise RuntimeError(f"the warm rlgate did not start within {START_TIMEOUT_S} s (it said {line!r})")
        _warm = (process, path)
    return _warm[1]


def _stop(process: subprocess.Popen, folder: str) -> None:
    """Its stdin closed, it returns (the runs it started are their tests'); bounded, then killed."""
    process.stdin.close()  # type: ignore[union-attr]
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(folder, ignore_errors=True)


def serve(path: str) -> None:
    """Listen on `path`; for each request fork a child that runs it, send the caller its pid, then its exit code."""
    for name in PRELOAD:
        importlib.import_module(name)
    assert threading.active_count() == 1, threading.enumerate()  # a fork copies only the forking thread
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ, "accept")
    events.register(sys.stdin, selectors.EVENT_READ, "stdin")
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the caller's connection)
    print("ready", flush=True)
    while True:
        for key, _ in events.select():
            if key.data == "stdin":
                if not sys.stdin.buffer.read1(4096):
                    return  # the test worker is gone: its children are its tests' to stop
            elif key.data == "accept":
                connection, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST_BYTES, 3)
                pid = os.fork()
                if pid == 0:  # nothing of the zygote's stays open in the child
                    for fd in (
                        listener.fileno(),
                        events.fileno(),
                        *waiting,
                        *(c.fileno() for _, c in waiting.values()),
                    ):
                        os.close(fd)
                    connection.close()
                    _run_child(json.loads(message), fds)
                for fd in fds:
                    os.close(fd)
                connection.sendall(f"{pid}\n".encode())
                pidfd = os.pidfd_open(pid)
                events.register(pidfd, selectors.EVENT_READ, "exit")
                waiting[pidfd] = (pid, connection)
            else:
                pid, connection = waiting.pop(key.fd)
                events.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with connection:
                    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def _run_child(request: dict, fds: list[int]) -> None:
    """In the child: become `python -m rlgate ARGS` in the caller's directory and environment; never returns."""
    code: object = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        if request["new_session"]:
            os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
        import numpy

        from rlgate.cli.main import main

        numpy.random.seed()  # a fresh process seeds numpy's global generator from the OS (`random` reseeds itself)
        # As under `python -m rlgate`: multiprocessing's spawned children, among others, look at __main__.
        spec = importlib.util.find_spec("rlgate.__main__")
        main_module = types.ModuleType("__main__")
        main_module.__spec__, main_module.__file__, main_module.__package__ = spec, spec.origin, "rlgate"  # type: ignore[union-attr]
        sys.modules["__main__"] = main_module
        sys.argv = [spec.origin, *request["args"]]  # type: ignore[union-attr,list-item]
        code = main(request["args"])
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # what Python prints for an uncaught exception, and its exit status
        traceback.print_exc()
        code = 1
    os._exit(_finish(code))


def _finish(code: object) -> int:
    """Python's own exit: wait for non-daemon threads, run atexit functions, flush; SystemExit's code as an int."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
    return code


if __name__ == "__main__":
    serve(sys.argv[1])
