"""The bearer token as a file (compose and Kubernetes secrets): read by services and clients alike."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlgate.client.settings import ClientSettings
from rlgate.server.settings import ServerSettings


def test_the_token_file_is_read_and_stripped(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("  s3cret\n")
    assert ServerSettings(token_file=secret).bearer_token() == "s3cret"
    assert ClientSettings(token_file=secret).bearer_token() == "s3cret"
    assert ServerSettings().bearer_token() is None


@pytest.mark.parametrize(
    ("write", "extra", "message"),
    [
        ("", {}, "is empty"),
        (None, {}, "No such file"),
        ("x", {"token": "y"}, "set --token or --token-file, not both"),
    ],
)
def test_a_bad_token_file_is_refused_with_the_reason(tmp_path: Path, write: str | None, extra: dict, message: str):
    secret = tmp_path / "token"
    if write is not None:
        secret.write_text(write)
    with pytest.raises(ValidationError, match=message):
        ServerSettings(token_file=secret, **extra)


async def test_env_clients_in_their_own_processes_authenticate_with_the_token_file(server_factory, tmp_path):
    """`rlgate env` hands its settings to spawned client processes; the token must survive the trip."""
    secret = tmp_path / "token"
    secret.write_text("t0k\n")
    server = await server_factory(token_file=secret, env="CartPole-v1")
    command = [sys.executable, "-m", "rlgate", "env", "--server", f"127.0.0.1:{server.port}", "--env", "CartPole-v1"]
    command += ["--token-file", str(secret), "--max-steps", "20", "--num-clients", "2", "--no-progress"]
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)  # the loop serves on
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert server.service.env_steps >= 2 * 20 - 2
    assert "t0k" not in " ".join(command)  # the token itself never is an argument
