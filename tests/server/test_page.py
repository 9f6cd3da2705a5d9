"""The inference server's live page in a real headless Chromium: sessions, batches, version, the learner link."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from support.browser import attribute, dom, inner, screenshot, text
from support.servers import running_client, target, until, wait_for_steps

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer
from rlgate.learner.settings import LearnerSettings


@pytest.mark.slow
async def test_the_server_page_shows_sessions_batches_and_links_its_learner(server_factory, tmp_path, capsys):
    no_updates = {"algorithm": {"train_batch_size": 1_000_000}}  # the version the page shows stays put
    settings = LearnerSettings(env="CartPole-v1", spec=no_updates, port=0, http_port=0, checkpoint_dir=tmp_path / "ck")
    learner = LearnerServer(settings)
    await learner.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner.port}")
        await until(lambda: server.host.core is not None and server.learner.learner_page() is not None, 15)
        client = EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3), target(server), seed=0)
        client.client_id = "page-client"
        async with running_client(client):
            await wait_for_steps(client, 50)
            url = f"http://127.0.0.1:{server.http_port}/"
            page = await dom(url, tmp_path / "profile")
            await screenshot(url, tmp_path / "profile", tmp_path / "server-page.png", capsys)
        status = server.status.status()
        assert text(page, "env") == "CartPole-v1"
        assert text(page, "version") == str(server.host.core.version)
        assert text(page, "sessions") == "1"
        assert int(text(page, "batches")) > 0 and float(text(page, "batch-size")) == 3.0  # one client of 3 sub-envs
        assert status["batches"] >= int(text(page, "batches"))
        sessions = inner(page, "session-list", "tbody")
        assert "<td>page-client</td><td>3</td><td>yes</td>" in sessions
        assert f'href="http://127.0.0.1:{learner.http_port}/"' in inner(page, "learner", "b")
        assert int(attribute(page, "chart-throughput", "data-points")) >= 2  # one per poll after the first
        assert json.loads(text(page, "spec"))["env"]["id"] == "CartPole-v1"
        await server.stop()
    finally:
        await learner.stop()


async def test_a_server_without_model_says_so(server_factory, tmp_path):
    server = await server_factory()
    page = await dom(f"http://127.0.0.1:{server.http_port}/", tmp_path / "profile")
    assert text(page, "state") == "no model yet" and text(page, "learner") == "none"
    assert text(page, "sessions") == "0" and "<td" in inner(page, "session-list", "tbody")
