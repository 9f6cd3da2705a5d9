"""The HTTP side of a service (FastAPI, served by uvicorn on the service's own event loop)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from rlgate.service.process import bind


def build_app(
    title: str,
    *,
    registry: CollectorRegistry,
    status: Callable[[], dict[str, Any]],
    ready: Callable[[], tuple[bool, str | None]],
) -> FastAPI:
    """/healthz (alive), /readyz, /status, /metrics.

    `ready()` is (ready, reason): /readyz answers 200 or 503, with the reason when there is one (why not
    ready; or, while ready, what is amiss that does not stop serving yet).
    """
    app = FastAPI(title=title, docs_url=None, redoc_url=None)

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


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn that leaves signals alone: the service that embeds it handles SIGTERM and Ctrl-C."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


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
