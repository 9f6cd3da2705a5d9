"""`rlgate env` as a real process: its clients may start processes of their own (`vectorize = "async"`), and
none of them outlives it."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from tests.support.cli import RLGATE, rlgate
from tests.support.processes import descendants
from tests.support.servers import until

ASYNC = ("--env", "CartPole-v1", "--spec.env.vectorize", "async", "--spec.env.num-envs", "2", "--num-clients", "2")


async def test_rlgate_env_runs_async_vector_envs_to_max_steps(server) -> None:
    code, stderr = await rlgate("env", "--server", f"127.0.0.1:{server.port}", *ASYNC, "--max-steps", "200")
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
async def test_rlgate_env_ends_its_clients_and_their_envs_at_sigterm(server) -> None:
    args = ("env", "--server", f"127.0.0.1:{server.port}", *ASYNC, "--no-progress")
    process = await asyncio.create_subprocess_exec(*RLGATE, *args, stdin=asyncio.subprocess.DEVNULL)
    try:
        await until(lambda: len(server.service.sessions) == 2, timeout=60)  # both clients stepping their envs
        started = descendants(process.pid)
        assert len(started) >= 2 + 2 * 2, started  # 2 clients, 2 env processes each
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        await until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in started), timeout=10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
