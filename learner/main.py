"""`rlgate learn`: the learner service, gRPC (LearnerService) and HTTP on one event loop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import grpc
import torch
from fastapi import Query
from grpc_health.v1 import health

from rlgate.learner.history import PAGE_LIMIT
from rlgate.learner.learner import Learner
from rlgate.learner.servicer import SERVICE_NAME, LearnerServicer
from rlgate.learner.settings import LearnerSettings
from rlgate.service.http import HttpServer, build_app, read_page
from rlgate.service.process import ensure_free, run_until_signal, start_grpc_server

log = logging.getLogger(__name__)


class LearnerServer:
    """The `rlgate learn` process: the Learner behind a grpc.aio server and a FastAPI app."""

    def __init__(self, settings: LearnerSettings) -> None:
        self.settings = settings
        # A learner already on these ports may own this checkpoint directory: leave its intake alone.
        ensure_free(settings.host, settings.port, "--port")
        ensure_free(settings.host, settings.http_port, "--http-port")
        self.learner = Learner(settings)
        self.port = 0
        self.http_port = 0
        self._health = health.aio.HealthServicer()
        self._grpc: grpc.aio.Server | None = None
        self._http: HttpServer | None = None
        self._trainer_task: asyncio.Task | None = None

    async def start(self) -> None:
        s = self.settings
        if s.torch_threads is not None:
            torch.set_num_threads(s.torch_threads)
        app = build_app(
            "rlgate learner",
            registry=self.learner.metrics.registry,
            status=self.learner.status,
            ready=lambda: (True, None),
            page=read_page("rlgate.learner"),
        )
        progress = self.learner.progress

        @app.get("/history/{series}")
        async def history(
            series: Literal["updates", "episodes"], start: int = 0, limit: int = Query(PAGE_LIMIT, ge=1, le=PAGE_LIMIT)
        ) -> dict[str, Any]:
            """Rows from index `start` on: one per update (every logged number) or per finished episode."""
            return getattr(progress, series).page(start, limit)

        @app.get("/spec")
        async def spec() -> dict[str, Any]:
            return self.learner.spec.model_dump(mode="json")

        self._http = HttpServer(app, s.host, s.http_port)  # both ports are taken before anything starts
        self._grpc, self.port = await start_grpc_server(
            SERVICE_NAME,
            lambda server: server.add_generic_rpc_handlers(
                [LearnerServicer(self.learner, http_port=lambda: self.http_port).handler()]
            ),
            self._health,
            address=f"{s.host}:{s.port}",
            max_message_bytes=256 << 20,
            token=s.bearer_token(),
            tls=s.tls(),
        )
        self._http.start()
        self.http_port = self._http.port
        self._trainer_task = asyncio.get_running_loop().create_task(self.learner.train_forever(), name="trainer")
        log.info(
            "learning grpc=%s:%d http=%s:%d version=%d",
            s.host,
            self.port,
            s.host,
            self.http_port,
            self.learner.trainer.version,
        )
        log.info("%s", s.preset_line())

    async def stop(self) -> None:
        """Stop taking data, write a final checkpoint, stop serving."""
        await self._health.enter_graceful_shutdown()
        if self._trainer_task is not None:
            self._trainer_task.cancel()
            await asyncio.gather(self._trainer_task, return_exceptions=True)
        if self._grpc is not None:
            await self._grpc.stop(1.0)
        path = await self.learner.save_checkpoint()
        self.learner.progress.close()
        log.info("stopped; final checkpoint %s", path)
        if self._http is not None:
            await self._http.stop()


def main(argv: list[str]) -> int:
    settings = LearnerSettings(_cli_parse_args=argv, _cli_prog_name="rlgate learn")
    asyncio.run(run_until_signal(lambda: LearnerServer(settings)))
    return 0
