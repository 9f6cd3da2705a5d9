"""Child processes of the bench: servers and load generators, pinned to cores, and what we read from them.

Every child is a `python -m <module>` of this interpreter, pinned with `os.sched_setaffinity` before it
starts (torch sizes its thread pool from the affinity), and ended by `stop()`: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rlgate.service.settings import Backend

# The line a service logs once it is up: `serving grpc=...` (rlgate serve, the floor) or `learning grpc=...`.
_SERVING = re.compile(r"(?:serving|learning) grpc=(\S+)(?: http=(\S+))?")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def split_cores() -> tuple[set[int], set[int]]:
    """(server cores, client cores): the first core for the server, the others for the clients."""
    cores = sorted(os.sched_getaffinity(0))
    return {cores[0]}, set(cores[1:]) or {cores[0]}


def host_busy_seconds() -> float:
    """CPU time the whole host (every core) has spent busy since boot, from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


def own_seconds() -> float:
    """CPU time of this process and of its children that have exited and been waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def source_path(checkout: Path, scratch: Path, module: str) -> tuple[list[str], str]:
    """The PYTHONPATH that imports a checkout's code from its folders, and `module`'s name in that checkout.

    A checkout with the `rlgate.*` namespace maps its folders into the package at install time
    (pyproject's package-dir); uninstalled, `scratch/rlgate` is made as that package out of symbolic links
    to its folders. A checkout from before the namespace had top-level packages (`python -m server`).
    """
    pyproject = tomllib.loads((checkout / "pyproject.toml").read_text())
    folders = pyproject.get("tool", {}).get("setuptools", {}).get("package-dir")
    if folders is None:
        return [str(checkout), str(checkout / "proto")], "server" if module == "rlgate" else module
    package = scratch / "rlgate"
    shutil.rmtree(scratch, ignore_errors=True)
    package.mkdir(parents=True)
    for entry in (checkout / folders["rlgate"]).iterdir():
        (package / entry.name).symlink_to(entry.resolve())
    for name, folder in folders.items():
        if name != "rlgate":
            (package / name.removeprefix("rlgate.")).symlink_to((checkout / folder).resolve())
    return [str(scratch)], module


class Child:
    """A `python -m module args...` child pinned to `cores`; stderr goes to `log`.

    With `checkout` (a directory holding another copy of this repository), the child runs that copy's
    code, imported from its source folders (`source_path`). Used to measure two versions side by side
    (`bench.compare`). With `program`, the child runs that command line instead, in `checkout`.
    """

    def __init__(
        self,
        module: str,
        args: list[str],
        cores: set[int],
        log: Path,
        *,
        pipes: bool = False,
        checkout: Path | None = None,
        program: list[str] | None = None,
    ) -> None:
        self.log = log
        self._log_file = log.open("wb")
        env = None
        if checkout is not None and program is None:
            path, module = source_path(checkout, log.with_suffix(".src"), module)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen(
            program or [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stderr=self._log_file,
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
            cwd=checkout,
            env=env,
        )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, and SIGKILL if it has not exited after `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._log_file.close()

    def failure(self, what: str) -> RuntimeError:
        """An error that says what failed, with the end of the child's log."""
        tail = self.log.read_text(errors="replace")[-3000:]
        return RuntimeError(f"{what} (exit code {self.proc.poll()}); end of {self.log}:\n{tail}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the child (all its threads) so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class ServerProcess(Child):
    """A service child (`rlgate serve`, `rlgate learn` or the bare floor); `wait_serving()` before use."""

    target: str  # gRPC HOST:PORT
    http: str | None  # HTTP HOST:PORT (the floor has none)

    def wait_serving(self, timeout: float = 60.0) -> ServerProcess:
        """Wait for the line it logs once it is up, and read its addresses from it."""
        deadline = time.monotonic() + timeout
        while (found := _SERVING.search(self.log.read_text(errors="replace"))) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                command = self.proc.args
                assert isinstance(command, list)  # [python, -m, module, ...]
                raise self.failure(f"{command[2]} did not start")
            time.sleep(0.05)
        self.target, self.http = found.group(1), found.group(2)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until its /readyz answers 200 (e.g. a server with a learner has its first weights)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.http}/readyz", timeout=10):
                    return
            except urllib.error.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise self.failure("server did not get ready") from None
                time.sleep(0.1)

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus samples, keyed `name` or `name:label values` (e.g. `..._total:decode`)."""
        if self.http is None:
            return {}
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {
            ":".join([sample.name, *sample.labels.values()]): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


class LoadProcess(Child):
    """A `bench.load` child: K clients of E envs; talks the line protocol described there."""

    def __init__(
        self,
        target: str,
        clients: int,
        envs: int,
        real_envs: bool,
        cores: set[int],
        log: Path,
        spec: Path | None = None,
        local_spool: Path | None = None,
        local_backend: Backend = "torch",
    ) -> None:
        """`spec`: the env of this run spec file; `local_spool`: the clients act themselves (local inference) and
        spool their episodes there, their forward pass in `local_backend`."""
        args = ["--target", target, "--clients", str(clients), "--envs", str(envs)]
        args += ["--real-envs"] if real_envs else []
        args += ["--spec", str(spec)] if spec else []
        args += ["--local-spool", str(local_spool), "--local-backend", local_backend] if local_spool is not None else []
        super().__init__("rlgate.bench.load", args, cores, log, pipes=True)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        self.proc.stdin.flush()

    def read_line(self, timeout: float = 60.0) -> str:
        """The next line it prints (each command is answered by at most one line, so none is buffered)."""
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if readable else ""
        if not line:
            raise self.failure("load generator failed")
        return line

    def read_json(self) -> dict[str, Any]:
        return json.loads(self.read_line())


#: The .proto files' include folder in a checkout, as clients/node's client loads them.
PROTO_DIR = Path(__file__).resolve().parent.parent / "proto"


class NodeLoadProcess(LoadProcess):
    """One Node.js client of one env acting itself (`clients/node/client.mjs --mode local --bench`), run in
    `folder`, which holds client.mjs beside its node_modules (`npm ci` in clients/node); it talks bench.load's line
    protocol."""

    def __init__(self, target: str, folder: Path, cores: set[int], log: Path, client_id: str) -> None:
        folder = folder.resolve()  # (it runs in that folder)
        command = [shutil.which("node") or "node", str(folder / "client.mjs"), "--server", target, "--mode", "local"]
        command += ["--bench", "--client-id", client_id, "--proto-dir", str(PROTO_DIR), "--timeout-s", "86400"]
        Child.__init__(self, "", [], cores, log, pipes=True, checkout=folder, program=command)
