"""Fixtures shared by every test folder: real inference servers on 127.0.0.1 port 0, stopped at teardown."""

from __future__ import annotations

import os

# One torch (OpenMP) thread per process, for the tests and every process they start, before anything imports
# torch: the suite runs a worker per core, each starting servers, learners and clients, and torch's default of a
# thread per core had every parallel op wait on threads descheduled by the others (bench.screen's in-process
# training took 21.5 s beside another worker, 1.8 s alone). Tests that need another count set it themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import asyncio
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rlgate.server.main import InferenceServer
from rlgate.server.settings import ServerSettings
from rlgate.spec.run import RunSpec

ROOT = Path(__file__).resolve().parent.parent


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`--numprocesses auto`: a worker more than the cores, at most 4. About a quarter of the suite's time is
    spent waiting (on processes starting, a collective's timeout, a learner that is away), which a third worker
    on 2 cores fills: 382 s -> 337 s of tests, measured in one session on this 2-core machine."""
    return min(4, len(os.sched_getaffinity(0)) + 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `slow` tests first (each keeping its order): pytest-xdist's workers take tests in this order, so they
    end on short ones, instead of one worker running a 30-second test alone at the end while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def examples_importable(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The repository's `examples` package importable (and nothing else of the repository's top level)."""
    folder = tmp_path_factory.mktemp("path")
    (folder / "examples").symlink_to(ROOT / "examples")
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1 and its key (PEM files), made by openssl."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
    command += ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    made = subprocess.run(command, capture_output=True)
    if made.returncode != 0:
        pytest.fail(f"openssl could not make a test certificate: {made.stderr.decode()}")
    return cert, key


@pytest.fixture
async def server_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[InferenceServer]]]:
    """Factory: `await server_factory(**settings)` gives a started server; all are stopped at teardown."""
    started: list[InferenceServer] = []

    async def start(spec: RunSpec | None = None, **overrides: Any) -> InferenceServer:
        """`spec`: the run spec of a fresh model (a server without a learner); overrides: ServerSettings fields."""
        fields = {
            "host": "127.0.0.1",
            "port": 0,
            "http_port": 0,
            "episode_dir": tmp_path / "episodes",
            "spool_dir": tmp_path / "spool",
            "seed": 0,
            "drain_timeout_s": 5.0,
        }
        fields.update(overrides)
        server = InferenceServer(ServerSettings(**fields), spec=spec)
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        if not server.service.draining:
            await server.stop()


@pytest.fixture
async def server(server_factory: Callable[..., Awaitable[InferenceServer]]) -> InferenceServer:
    return await server_factory()


@pytest.fixture
def http_get() -> Callable[[int, str], Awaitable[tuple[int, str]]]:
    """await http_get(port, path) -> (status, body), off the event loop (the servers run on it)."""

    async def get(port: int, path: str) -> tuple[int, str]:
        def fetch() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        return await asyncio.to_thread(fetch)

    return get
