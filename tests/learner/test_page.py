"""The learner's live page in a real headless Chromium: numbers and plots filled in from /status."""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

import pytest
from support.tools import required_command

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=5000",
)


async def chromium(binary: str, url: str, profile: Path, *flags: str) -> str:
    """Run headless Chromium on `url` (off the event loop, which serves the page) and return its stdout."""
    process = await asyncio.create_subprocess_exec(
        binary,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        *flags,
        url,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        stdout, _ = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0
    return stdout.decode()


def stat(dom: str, element_id: str) -> str:
    match = re.search(rf'<b id="{element_id}">([^<]*)</b>', dom)
    assert match, f"no #{element_id} in the page"
    return html.unescape(match[1])


@pytest.fixture
def binary() -> str:
    """Chromium's path (asked for before the learner starts: a test that skips costs nothing)."""
    return required_command("chromium", "chromium")


async def test_the_live_page_shows_version_steps_and_return_from_status(
    binary, learner_server, train_updates, tmp_path
):
    await train_updates(learner_server, 4)  # four points of throughput, and the returns of the episodes
    status = learner_server.learner.status()
    assert status["model_version"] == 4 and len(status["returns"]) >= 2
    url = f"http://127.0.0.1:{learner_server.http_port}/"

    dom = await chromium(binary, url, tmp_path / "profile", "--dump-dom")
    assert stat(dom, "version") == str(status["model_version"]) != "-"
    assert stat(dom, "steps") == str(round(status["env_steps_trained"]))
    assert stat(dom, "episodes") == str(status["episodes"])
    assert stat(dom, "return") == f"{status['mean_return']:.1f}"
    assert f'data-version="{status["model_version"]}"' in dom

    screenshot = tmp_path / "page.png"
    await chromium(binary, url, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1000,900")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
