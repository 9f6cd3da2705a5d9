"""A real headless Chromium for the live pages: the DOM after the page's scripts ran, and screenshots."""

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


async def chromium(url: str, profile: Path, *flags: str) -> str:
    """Run headless Chromium on `url` (off the event loop, which serves the page) and return its stdout."""
    binary = required_command("chromium", "chromium")
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


async def dom(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran for five seconds of virtual time."""
    return await chromium(url, profile, "--dump-dom")


async def screenshot(url: str, profile: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Save a PNG of the page at `path` (kept with the test's tmp dir, as an artefact) and print where."""
    await chromium(url, profile, f"--screenshot={path}", "--window-size=1200,1400")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with capsys.disabled():
        print(f"\nscreenshot of {url}: {path}")


def text(page: str, element_id: str) -> str:
    """The text of the element with this id (no nested tags)."""
    match = re.search(rf'<[a-z0-9]+ id="{element_id}"[^>]*>([^<]*)</', page)
    assert match, f"no #{element_id} in the page"
    return html.unescape(match[1])


def attribute(page: str, element_id: str, name: str) -> str:
    """An attribute of the element with this id."""
    match = re.search(rf'<[a-z0-9]+ [^>]*id="{element_id}"[^>]*>', page)
    assert match, f"no #{element_id} in the page"
    value = re.search(rf'{name}="([^"]*)"', match[0])
    assert value, f"#{element_id} has no {name}: {match[0]}"
    return html.unescape(value[1])


def inner(page: str, element_id: str, tag: str) -> str:
    """The HTML inside the `tag` element with this id (a table body, a list: no nested `tag` inside)."""
    match = re.search(rf'<{tag} id="{element_id}"[^>]*>(.*?)</{tag}>', page, re.S)
    assert match, f"no <{tag} id={element_id}> in the page"
    return match[1]
