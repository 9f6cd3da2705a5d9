"""The Node.js client of clients/node, written from proto/README.md and the .proto files alone, against a real
server: it plays CartPole episodes on its own JavaScript CartPole, and the server's episode files must hold
exactly the episodes it reports; a hello with wrong spaces gets the status the README promises.

Its npm dependencies (package-lock.json) are installed once per session with `npm ci` into .cache/node-client/
(gitignored), under a key of the lock, so later runs with the same lock install nothing. Without node or npm
the tests skip, saying why (they fail under CI=true); so do they where the npm registry cannot be reached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from support.tools import required_command

from rlgate.spec.episode_files import read_episodes

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT = ROOT / "clients" / "node"
CACHE = ROOT / ".cache" / "node-client"
TOKEN = "s3cret"
CLIENT_TIMEOUT_S = 60  # a run of a few short episodes takes well under a second
NPM_CI_TIMEOUT_S = 150
# npm's words for a registry it cannot reach: outside CI that skips the tests instead of failing them.
OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH", "network")

pytestmark = pytest.mark.timeout(NPM_CI_TIMEOUT_S + 2 * CLIENT_TIMEOUT_S)


def strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def node_client() -> tuple[str, Path]:
    """(node, the folder to run client.mjs in): the client beside node_modules installed by `npm ci`."""
    node = required_command("node", "nodejs")
    npm = required_command("npm", "npm")
    manifest = [(CLIENT / name).read_bytes() for name in ("package.json", "package-lock.json")]
    key = hashlib.sha256(b"\0".join(manifest)).hexdigest()[:16]
    folder = CACHE / key
    if not (folder / ".installed").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        for stale in CACHE.iterdir():  # installs of earlier locks, and installs cut short over an hour ago
            if stale.is_dir() and stale != folder and (not stale.name.startswith(".") or _older_than_an_hour(stale)):
                shutil.rmtree(stale, ignore_errors=True)
        # Installed beside the target, then renamed into place: a cut-short `npm ci` leaves no half install.
        work = Path(tempfile.mkdtemp(prefix=".install-", dir=CACHE))
        try:
            for name in ("package.json", "package-lock.json"):
                shutil.copy(CLIENT / name, work / name)
            command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline"]
            try:
                done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=NPM_CI_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # subprocess.run kills npm before raising
                done = subprocess.CompletedProcess(command, -1, "", f"npm ci took over {NPM_CI_TIMEOUT_S} s")
            if done.returncode != 0:
                output = done.stdout + done.stderr
                offline = [line for line in output.splitlines() if any(word in line for word in OFFLINE)]
                if not strict() and (done.returncode == -1 or offline):
                    said = (offline or output.splitlines() or [""])[0].strip()
                    pytest.skip(f"`npm ci` in clients/node cannot reach the npm registry: {said}")
                pytest.fail(f"`npm ci` in clients/node failed: {output[-3000:]}")
            (work / ".installed").touch()
            try:
                work.rename(folder)
            except OSError:  # another pytest run in this checkout installed the same lock meanwhile
                if not (folder / ".installed").exists():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    # Beside its node_modules, as ES imports need; replaced whole, so a client another run has started reads
    # the file it started with.
    copy = folder / f".client-{os.getpid()}.mjs"
    shutil.copy(CLIENT / "client.mjs", copy)
    os.replace(copy, folder / "client.mjs")
    return node, folder


def _older_than_an_hour(path: Path) -> bool:
    return time.time() - path.stat().st_mtime > 3600


async def run_client(node_client: tuple[str, Path], port: int, *args: str) -> dict:
    """Runs client.mjs against 127.0.0.1:port and returns its JSON summary; killed if it outlives its timeout."""
    node, folder = node_client
    command = [node, str(folder / "client.mjs"), "--server", f"127.0.0.1:{port}", "--proto-dir", str(ROOT / "proto")]
    command += ["--timeout-s", str(CLIENT_TIMEOUT_S - 5), *args]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=folder
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), CLIENT_TIMEOUT_S)
    finally:
        if process.returncode is None:  # timed out (or the test was cancelled): never leave it running
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"client.mjs exited {process.returncode}: {stderr.decode()[-3000:]}"
    return json.loads(stdout)


async def test_the_node_client_plays_episodes_that_the_server_records_as_it_reports(
    server_factory, tmp_path, node_client
):
    server = await server_factory(env="CartPole-v1", token=TOKEN)
    summary = await run_client(node_client, server.port, "--episodes", "5", "--seed", "7", "--token", TOKEN)
    await server.stop()  # writes the episode files still queued

    assert summary["health"] == {"": "SERVING", "rlgate.v1.PolicyService": "SERVING"}
    assert summary["status"] == "OK" and summary["episodes"] == 5
    lengths, returns = summary["lengths"], summary["returns"]
    assert len(lengths) == 5 and all(1 <= n <= 500 for n in lengths)
    assert returns == lengths and summary["env_steps"] == sum(lengths)
    assert all(t or u for t, u in zip(summary["terminated"], summary["truncated"], strict=True))
    assert summary["model_versions"] == [0]  # a fresh model, no learner

    # The server's episode files: every chunk of this session, joined into episodes (chunk 0 holds the reset).
    chunks = sorted(read_episodes(tmp_path / "episodes"), key=lambda e: (e.id_, e.chunk_index))
    assert chunks and all(c.id_.startswith(summary["session_id"]) for c in chunks)
    episodes: dict[str, list] = {}
    for chunk in chunks:
        episodes.setdefault(chunk.id_, []).append(chunk)
    assert len(episodes) == 5  # exactly the client's: it closed between episodes, so nothing ran on
    by_reset = {}
    for parts in episodes.values():
        assert [p.chunk_index for p in parts] == list(range(len(parts)))
        first = parts[0].get_observations(0)
        by_reset[first.tobytes()] = parts
    # Each reported episode, found by its reset observation (float32, as the client sent it).
    for i, reset in enumerate(summary["reset_observations"]):
        parts = by_reset.pop(np.asarray(reset, np.float32).tobytes())
        assert sum(len(p) for p in parts) == lengths[i]
        assert sum(p.get_return() for p in parts) == returns[i]
        assert all(np.all(p.get_rewards() == 1.0) for p in parts)
        assert (parts[-1].is_terminated, parts[-1].is_truncated) == (summary["terminated"][i], summary["truncated"][i])
        assert not any(p.is_done for p in parts[:-1])
        # The JavaScript CartPole moves as gymnasium's does: each recorded step, replayed from the recorded
        # observation with the recorded action, lands where the client said (float32 rounding apart).
        env = gym.make("CartPole-v1").unwrapped
        env.reset(seed=0)
        start = 0
        for part in parts:
            # The infos the client sent with every observation (its env's step count), kept with them.
            assert [info["steps"] for info in part.get_infos()] == list(range(start, start + len(part) + 1))
            start += len(part)
            observations, actions = part.get_observations(), part.get_actions()
            for t, action in enumerate(actions):
                env.state = observations[t].astype(np.float64)
                obs, reward, terminated, _, _ = env.step(int(action))
                np.testing.assert_allclose(obs, observations[t + 1], rtol=0, atol=1e-5)
                assert reward == part.get_rewards()[t]
        assert terminated == summary["terminated"][i]
    assert not by_reset


async def test_a_node_hello_with_wrong_spaces_gets_failed_precondition_naming_the_field(server_factory, node_client):
    server = await server_factory(env="CartPole-v1")
    answer = await run_client(node_client, server.port, "--mode", "wrong-spaces")
    assert answer == {
        "code": 9,
        "code_name": "FAILED_PRECONDITION",
        "details": "the hello's spaces must equal the served model's; they differ in (server != client): "
        "observation_space.dtype: float32 != float64",
    }
