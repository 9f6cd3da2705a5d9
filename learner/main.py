"""`rlgate learn`: the learner service, gRPC (LearnerService) and HTTP on one event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from typing import Any, Literal

import grpc
import torch
from fastapi import Query
from grpc_health.v1 import health

from rlgate.core.errors import UserError
from rlgate.learner.data_parallel import Group, GroupFailed, Rendezvous, fail
from rlgate.learner.device import learner_device
from rlgate.learner.follower import follow
from rlgate.learner.history import PAGE_LIMIT
from rlgate.learner.learner import Learner
from rlgate.learner.servicer import SERVICE_NAME, LearnerServicer
from rlgate.learner.settings import LearnerSettings
from rlgate.service.http import HttpServer, build_app, read_page
from rlgate.service.process import bind, ensure_free, run_until_signal, start_grpc_server
from rlgate.spec.algorithm import PPOConfig

log = logging.getLogger(__name__)
GRACE_S = 15.0  # the other data-parallel learners' time to end once rank 0 stops the group


class LearnerServer:
    """The `rlgate learn` process: the Learner behind a grpc.aio server and a FastAPI app."""

    def __init__(self, settings: LearnerSettings, rendezvous: Rendezvous | None = None) -> None:
        """`rendezvous`: where this process is rank 0 of data-parallel learners started by another (torchrun);
        None: it starts settings.num_learners - 1 more itself, if that is more than none."""
        self.settings = settings
        # A learner already on these ports may own this checkpoint directory: leave its intake alone.
        ensure_free(settings.host, settings.port, "--port")
        ensure_free(settings.host, settings.http_port, "--http-port")
        self.learner = Learner(settings)
        self._rendezvous = rendezvous
        self.num_learners = rendezvous.size if rendezvous else settings.num_learners
        if self.num_learners > 1:
            check_data_parallel(self.learner, self.num_learners)
        self._group: Group | None = None
        self._followers: dict[int, asyncio.subprocess.Process] = {}  # the ranks this process started, by rank
        self._watchers: list[asyncio.Task] = []
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
        if self.num_learners > 1:
            await self._form_group()
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
            "learning grpc=%s:%d http=%s:%d version=%d device=%s",
            s.host,
            self.port,
            s.host,
            self.http_port,
            self.learner.trainer.version,
            self.learner.device,
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
        if self._group is not None:
            await self._stop_group(self._group)
        if self._http is not None:
            await self._http.stop()

    # --- data-parallel learners -----------------------------------------------------------------------

    async def _form_group(self) -> None:
        """Start the other ranks (unless torchrun did), form the group, give them the run and the state."""
        s, learner = self.settings, self.learner
        rendezvous = self._rendezvous
        if rendezvous is None:
            with bind("127.0.0.1", 0, "--num-learners") as sock:
                rendezvous = Rendezvous(0, self.num_learners, "127.0.0.1", sock.getsockname()[1])
            command = [sys.executable, "-m", "rlgate", "learn", "--rendezvous-timeout-s", str(s.rendezvous_timeout_s)]
            command += ["--collective-timeout-s", str(s.collective_timeout_s)]
            command += ["--torch-threads", str(s.torch_threads)] if s.torch_threads is not None else []
            command += ["--device", s.device]  # each rank on cuda:LOCAL_RANK, or all on the CPU
            for rank in range(1, rendezvous.size):
                self._followers[rank] = await asyncio.create_subprocess_exec(
                    *command, env={**os.environ, **rendezvous.env(rank)}, stdin=subprocess.DEVNULL
                )
        try:
            self._group = await asyncio.to_thread(
                Group, rendezvous, s.rendezvous_timeout_s, learner.device, s.collective_timeout_s
            )
        except UserError:
            await self._end_followers(0.0)
            raise
        self._watchers = [asyncio.create_task(self._watch(r, p), name=f"rank {r}") for r, p in self._followers.items()]
        group = self._group

        def lead() -> None:
            group.send_start(learner.spec, learner.observation_space, learner.action_space)
            learner.trainer.join(group)

        await learner.in_trainer_thread(lead)
        self._watchers.append(asyncio.create_task(self._keep_alive(group), name="heartbeat"))  # once they follow

    async def _watch(self, rank: int, process: asyncio.subprocess.Process) -> None:
        """A rank that ends before the group is stopped breaks it: this process ends too, at once."""
        code = await process.wait()
        fail(GroupFailed(f"learner rank {rank} of {self.num_learners} exited with status {code}"))

    async def _keep_alive(self, group: Group) -> None:
        """Rank 0's heartbeat while no update runs (data_parallel.HEARTBEATS), on the trainer thread, between
        updates' collectives; a group found broken ends this process, as in an update."""
        while True:
            await asyncio.sleep(group.heartbeat_s)
            try:
                await self.learner.in_trainer_thread(group.keep_alive)
            except GroupFailed as exc:
                fail(exc)

    async def _stop_group(self, group: Group) -> None:
        """After the final checkpoint: the other ranks leave (on the trainer thread, after any update's
        collectives), then the group closes."""
        for watcher in self._watchers:
            watcher.cancel()
        try:
            await self.learner.in_trainer_thread(group.stop)
        except GroupFailed as exc:
            log.warning("%s", exc)
        await self._end_followers(GRACE_S)
        group.close()

    async def _end_followers(self, grace_s: float) -> None:
        """Wait up to `grace_s` for the ranks this process started to end; kill those that have not."""
        for rank, process in self._followers.items():
            try:
                await asyncio.wait_for(process.wait(), grace_s)
            except TimeoutError:
                log.warning("learner rank %d did not stop within %g s: killed", rank, grace_s)
                process.kill()
                await process.wait()


def check_data_parallel(learner: Learner, num_learners: int) -> None:
    """UserError unless this run can train on `num_learners` data-parallel learners."""
    algorithm = learner.spec.algorithm
    if isinstance(algorithm, PPOConfig):
        most = min(algorithm.train_batch_size, algorithm.minibatch_size)
        what = "env steps of a minibatch (--spec.algorithm.minibatch-size, --spec.algorithm.train-batch-size)"
    else:  # DQN, SAC: each update's train batch of replayed transitions is shared out
        most, what = algorithm.train_batch_size, "transitions of a train batch (--spec.algorithm.train-batch-size)"
    if num_learners > most:
        raise UserError(f"--num-learners {num_learners}: more learners than the {most} {what}: each needs at least one")


def learn(settings: LearnerSettings) -> int:
    """`rlgate learn` with its settings read (learner/command.py): rank 0 (or the only learner) serves, other ranks
    follow it; the exit status."""
    rendezvous = Rendezvous.from_env()
    learner_device(settings)  # a device that is not there: one line, exit 2, before anything starts
    if rendezvous is not None and rendezvous.rank > 0:
        return follow(settings, rendezvous)
    asyncio.run(run_until_signal(lambda: LearnerServer(settings, rendezvous)))
    return 0
