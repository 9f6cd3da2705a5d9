"""The HTTP side of a service (FastAPI, served by uvicorn on the service's own event loop, or on a thread's)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from rlgate.service.process import bind


def build_app(
    title: str,
    *,
    registry: CollectorRegistry,
    status: Callable[[], dict[str, Any]],
    ready: Callable[[], tuple[bool, str | None]],
    page: str | None = None,
) -> FastAPI:
    """/healthz (alive), /readyz, /status, /metrics; with `page` (HTML), the service's live page at `/`,
    which loads the shared scripts under /static.

    `ready()` is (ready, reason): /readyz answers 200 or 503, with the reason when there is one (why not
    ready; or, while ready, what is amiss that does not stop serving yet).
    """
    app = FastAPI(title=title, docs_url=None, redoc_url=None)
    if page is not None:
        app.mount("/static", StaticFiles(packages=[("rlgate.service", "static")]), name="static")

        @app.get("/", include_in_schema=False)
        async def page_() -> HTMLResponse:
            return HTMLResponse(page)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        is_ready, reason = ready()
        body = {"status": "ready" if is_ready else "not ready", **({"reason": reason} if reason else {})}
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @app.get("/status")
    async def status_() -> dict[str, Any]:
        return status()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def read_page(package: str) -> str:
    """The live page a service ships as package data (`page.html` in `package`)."""
    return importlib.resources.files(package).joinpath("page.html").read_text()


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn that leaves signals alone: the service that embeds it handles SIGTERM and Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """uvicorn on an already-bound socket, so port 0 works and the real port is known before serving."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self._socket = bind(host, port, "--http-port")
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = _EmbeddedUvicorn(config)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self._socket]), name="rlgate-http"
        )

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self._socket.close()


class ThreadedHttpServer:
    """An HttpServer on an event loop of its own thread, for a process whose main thread is not an event loop (a
    data-parallel learner's follower, blocked in collectives)."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self._server = HttpServer(app, host, port)  # binds now: a taken port fails before anything starts
        self.port = self._server.port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlgate-http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._loop.call_soon_threadsafe(self._server.start)

    def stop(self, timeout_s: float = 5.0) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        self._loop.close()
