"""The learner's live page in a real headless Chromium: numbers, charts against env steps, connected servers,
the update indicator; and the paged histories it reads."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.browser import attribute, dom, inner, screenshot, text
from support.servers import until

from rlgate.learner.main import LearnerServer


@pytest.mark.slow
async def test_the_live_page_shows_progress_charts_and_the_connected_server(
    learner_server, train_updates, server_factory, tmp_path, capsys
):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}", server_id="page-test-server")
    await train_updates(learner_server, 4)
    learner = learner_server.learner
    await until(lambda: learner.servers.connected() != [], 10)  # the server reports every second
    status = learner.status()
    assert status["model_version"] == 4 and status["episodes"] >= 2
    url = f"http://127.0.0.1:{learner_server.http_port}/"

    page = await dom(url, tmp_path / "profile")
    assert text(page, "env") == "CartPole-v1"
    assert text(page, "version") == "4" and 'data-version="4"' in page
    assert text(page, "steps") == str(status["env_steps_trained"])
    assert text(page, "episodes") == str(status["episodes"])
    assert text(page, "return") == f"{status['mean_return']:.1f}"
    # Every chart is drawn against env steps: one point per update, and one per finished episode.
    for chart in ("throughput", "losses", "entropy", "kl", "staleness"):
        assert attribute(page, f"chart-{chart}", "data-points") == "4", chart
        assert attribute(page, f"chart-{chart}", "data-x-max") == str(status["env_steps_trained"]), chart
    assert attribute(page, "chart-return", "data-points") == str(status["episodes"])
    assert page.count('class="uplot') == 6  # the vendored chart library drew all six
    servers = inner(page, "servers", "tbody")
    assert "page-test-server" in servers and f'href="http://127.0.0.1:{server.http_port}/"' in servers
    assert attribute(page, "state", "data-servers") == "1"
    assert text(page, "state").startswith("waiting for data:") and "from 1 server" in text(page, "state")
    assert json.loads(text(page, "spec"))["env"]["id"] == "CartPole-v1"

    await screenshot(url, tmp_path / "profile", tmp_path / "learner-page.png", capsys)


@pytest.mark.slow
async def test_the_page_says_an_update_is_in_progress_and_when_no_server_is_connected(
    learner_settings, train_updates, tmp_path
):
    release = tmp_path / "release-the-update"
    spec = {"connectors": {"learner": [{"type": "support.pieces:WaitForFile", "path": str(release)}]}}
    learner_server = LearnerServer(learner_settings(spec))
    await learner_server.start()
    try:
        url = f"http://127.0.0.1:{learner_server.http_port}/"
        page = await dom(url, tmp_path / "profile")
        assert text(page, "state") == "waiting for data: no inference server connected"
        assert attribute(page, "state", "data-updating") == "false"

        training = asyncio.create_task(train_updates(learner_server, 1))
        await until(lambda: learner_server.learner.updating_since is not None, 30)
        page = await dom(url, tmp_path / "profile")
        assert text(page, "state").startswith("update in progress (")
        assert attribute(page, "state", "data-updating") == "true"
        release.touch()
        await asyncio.wait_for(training, 30)
        assert learner_server.learner.status()["update_in_progress"] is False
    finally:
        release.touch()
        await learner_server.stop()


async def test_histories_are_paged_and_status_stays_compact(learner_server, train_updates, http_get):
    await train_updates(learner_server, 3)
    port = learner_server.http_port
    code, body = await http_get(port, "/history/updates?start=1&limit=1")
    page = json.loads(body)
    assert code == 200 and (page["start"], page["next"], page["total"]) == (1, 2, 3)
    assert [row["version"] for row in page["rows"]] == [2]
    row = page["rows"][0]
    for key in ("policy_loss", "vf_loss", "entropy", "kl", "clip_fraction", "explained_variance", "lr", "update_s"):
        assert isinstance(row[key], float), key
    code, body = await http_get(port, "/history/episodes?start=0")
    episodes = json.loads(body)
    assert code == 200 and episodes["total"] == learner_server.learner.status()["episodes"] == len(episodes["rows"])
    assert all(e["length"] >= 1 and e["return"] == e["length"] for e in episodes["rows"])  # CartPole: 1 per step
    code, _ = await http_get(port, "/history/other")
    assert code == 422
    code, body = await http_get(port, "/status")
    status = json.loads(body)
    assert code == 200 and status["history"] == {"updates": 3, "episodes": episodes["total"]}
    assert len(body) < 2000  # no histories in /status: `rlgate up` polls it twice a second
