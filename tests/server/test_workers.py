"""`rlgate serve --workers 2`: two real server processes on one gRPC port, a real learner, real env clients."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import gymnasium as gym
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlgate.client.env_client import EnvClient
from tests.support.cli import rlgate
from tests.support.learners import Learners, children, free_port

CLIENTS = 12  # connections land on a worker by a hash of their ports: all 12 on one of 2 has odds 1/2048
QUICK = ("--spec.algorithm.train-batch-size", "256", "--spec.algorithm.minibatch-size", "128")
QUICK += ("--spec.algorithm.num-epochs", "1")


def total(metrics: str, name: str) -> float:
    """The sum of a Prometheus text page's samples called `name` (all label values)."""
    return sum(s.value for f in text_string_to_metric_families(metrics) for s in f.samples if s.name == name)


async def poll(get: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], timeout: float) -> Any:
    """get() until done(what it returned), bounded in time."""
    async with asyncio.timeout(timeout):
        while not done(found := await get()):
            await asyncio.sleep(0.1)
    return found


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_workers_share_the_port_the_clients_and_the_learners_weights(tmp_path: Path, http_get) -> None:
    learners = Learners(tmp_path)
    learner_http = free_port()
    learners.start("learner", *QUICK, "--http-port", str(learner_http))
    port = free_port()
    command = [sys.executable, "-m", "rlgate", "serve", "--workers", "2", "--learner", learners.target]
    command += ["--port", str(port), "--http-port", "0", "--spool-dir", str(tmp_path / "spool"), "--server-id", "s"]
    command += ["--drain-timeout-s", "30"]  # time for the learner to ack the last episodes, on a loaded machine
    with open(tmp_path / "serve.log", "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    clients = [EnvClient(gym.make("CartPole-v1"), f"127.0.0.1:{port}", seed=i) for i in range(CLIENTS)]
    tasks = []
    try:

        async def learner_status() -> dict[str, Any]:
            try:
                code, body = await http_get(learner_http, "/status")
            except OSError:  # not listening yet
                return {}
            return json.loads(body) if code == 200 else {}

        async def worker(port: int, path: str) -> str:
            return (await http_get(port, path))[1]

        # Both workers report to the learner under their own ids, each with the learner's weights.
        status = await poll(
            learner_status,
            lambda s: (
                [(w["id"], w["model_version"] is not None) for w in s.get("servers", [])]
                == [("s-w0", True), ("s-w1", True)]
            ),
            60,
        )
        pages = [urlparse(w["page"]).port for w in status["servers"]]
        tasks = [asyncio.create_task(client.run()) for client in clients]
        # The workers share their port with nobody else: a plain `rlgate serve` there fails at once.
        intruder = asyncio.create_task(rlgate("serve", "--port", str(port), "--http-port", "0", "--env", "CartPole-v1"))
        # The clients' connections are spread over both workers; they sample until the learner has trained.
        for page in pages:
            await poll(lambda page=page: worker(page, "/status"), lambda body: json.loads(body)["sessions"] > 0, 30)
        await poll(learner_status, lambda s: s["model_version"] >= 1, 60)
        versions = [
            (await poll(lambda p=p: worker(p, "/status"), lambda b: json.loads(b)["model_version"] >= 1, 30))
            for p in pages
        ]
        assert len(versions) == 2
        for client in clients:
            client.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert sum(c.stats.env_steps for c in clients) >= 256
        for page in pages:  # every session closed: its episodes shipped
            await poll(lambda page=page: worker(page, "/status"), lambda body: json.loads(body)["sessions"] == 0, 30)
        code, stderr = await asyncio.wait_for(intruder, 60)
        assert code == 2 and f"cannot listen on 127.0.0.1:{port} (--port): Address already in use" in stderr, stderr
        shipped = [total(await worker(page, "/metrics"), "rlgate_episodes_total") for page in pages]
        assert all(count > 0 for count in shipped), shipped
        # A stop drains every worker's spool to the learner: nothing shipped is lost, nothing comes twice.
        server.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.wait, 60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
        learner_metrics = (await http_get(learner_http, "/metrics"))[1]
        assert total(learner_metrics, "rlgate_learner_episodes_total") == sum(shipped)
        assert total(learner_metrics, "rlgate_learner_duplicates_total") == 0
        assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == ["s-w0", "s-w1"]
        assert not [f for f in (tmp_path / "spool").rglob("*") if f.is_file()]
    finally:
        for client in clients:
            client.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server.poll() is None:
            server.kill()
        server.wait()
        learners.kill_all()


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (reaped, or a zombie waiting for whoever adopted it)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dies", ["worker", pytest.param("parent", marks=pytest.mark.slow)])
@pytest.mark.slow
async def test_when_a_worker_or_the_parent_dies_the_rest_stop(tmp_path: Path, dies: str) -> None:
    """A worker killed: the parent stops the other and fails. The parent killed: its workers stop themselves."""
    command = [sys.executable, "-m", "rlgate", "serve", "--workers", "2", "--env", "CartPole-v1"]
    command += ["--port", "0", "--http-port", "0", "--spool-dir", str(tmp_path / "spool")]
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        serving = await poll(
            lambda: asyncio.to_thread(log_path.read_text), lambda text: text.count("main serving grpc=") == 2, 60
        )
        assert " w0 " in serving and " w1 " in serving
        # The workers are the children of the parent's fork server (multiprocessing's: server/workers.py).
        (forkserver,) = (
            pid for pid in children(server.pid) if "forkserver" in Path(f"/proc/{pid}/cmdline").read_text()
        )
        workers = children(forkserver)
        assert len(workers) == 2
        if dies == "worker":
            os.kill(workers[0], signal.SIGKILL)
            assert await asyncio.to_thread(server.wait, 60) == 1
            assert "worker w0 exited (status -9): stopping the others" in log_path.read_text()
            assert gone(workers[1])  # stopped, and reaped by the parent
        else:
            server.kill()
            await poll(lambda: asyncio.sleep(0, all(gone(pid) for pid in workers)), bool, 60)
            assert log_path.read_text().count("rlgate.server.main stopped") == 2  # each stopped gracefully
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        for pid in workers:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
