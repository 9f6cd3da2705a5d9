"""`rlgate serve --workers N`: N server processes on one gRPC port, started, watched and stopped by a parent.

The kernel spreads connections over processes listening with SO_REUSEPORT; this is the one place rlgate
shares a port on purpose. The parent holds the port (`reserve_shared_port`) while its workers run, so no
other process joins them there. Each worker is a whole `rlgate serve`: its own sessions, batcher, learner
link (server id `<server_id>-w<i>`, so its spool is its own) and HTTP port (`http_port + i`): /status and
/metrics describe one worker, and Prometheus scrapes each as a target of its own (simpler and exact, where
prometheus_client's multiprocess mode would aggregate /metrics only, not /status or the page).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait

import setproctitle

from rlgate.core.errors import UserError
from rlgate.server.settings import ServerSettings
from rlgate.service.fork_server import fork_server, stop_with_parent
from rlgate.service.process import ensure_free, reserve_shared_port

log = logging.getLogger(__name__)

USAGE_ERROR = 2  # a worker's own user error (a missing checkpoint...): one line, as `rlgate` prints it
LOG_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s %(message)s"
STOP_GRACE_S = 30.0  # after a stop, beyond what draining may take, before a worker is killed
WORKER_MODULES = ("rlgate.server.command", "rlgate.server.main")  # what a worker imports (server/command.py)


def run_workers(settings: ServerSettings, serve: Callable[[ServerSettings], None]) -> int:
    """Run `serve(settings of worker i)` in settings.workers worker processes until SIGTERM or Ctrl-C (each
    forwarded to them as SIGTERM) or until one of them ends; 0 when all stopped cleanly on a signal."""
    s = settings
    if s.http_port and s.http_port + s.workers - 1 > 65535:
        raise UserError(f"--http-port {s.http_port} + {s.workers} workers: their ports pass 65535")
    with reserve_shared_port(s.host, s.port, "--port") as held:
        port = held.getsockname()[1]
        for i in range(s.workers if s.http_port else 0):
            ensure_free(s.host, s.http_port + i, "--http-port")
        context = fork_server(WORKER_MODULES)  # started by the first worker's start, below the signal handlers
        workers = [
            context.Process(target=_worker, args=(serve, worker_settings(s, i, port)), name=f"w{i}")
            for i in range(s.workers)
        ]
        stopping: list[float] = []  # when the stop began

        def stop(*_: object) -> None:
            if not stopping:
                stopping.append(time.monotonic())
            for worker in workers:
                if worker.pid is not None:
                    worker.terminate()  # SIGTERM: it drains its sessions and flushes its episodes

        signal.signal(signal.SIGTERM, stop)
        if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:  # ignored under `rlgate up`: the workers inherit that
            signal.signal(signal.SIGINT, stop)
        for worker in workers:
            if not stopping:
                worker.start()
        if stopping:  # a signal during the starts: the last one started may have missed it
            stop()
        log.info("started %d workers on grpc=%s:%d", s.workers, s.host, port)
        return _watch([w for w in workers if w.pid is not None], stop, stopping, 2 * s.drain_timeout_s + STOP_GRACE_S)


def worker_settings(settings: ServerSettings, index: int, port: int) -> ServerSettings:
    """Worker `index`'s settings: the shared gRPC port, its own HTTP port and server id."""
    http_port = settings.http_port + index if settings.http_port else 0
    update = {"workers": 1, "port": port, "http_port": http_port, "server_id": f"{settings.server_id}-w{index}"}
    return settings.model_copy(update=update)


def _watch(workers: list, stop: Callable[[], None], stopping: list[float], grace_s: float) -> int:
    """Wait for every worker to end; the first to end unasked stops the others and fails the whole."""
    code = 0
    pending = list(workers)
    while pending:
        timeout = None if not stopping else max(0.0, stopping[0] + grace_s - time.monotonic())
        ended = wait([w.sentinel for w in pending], timeout)
        if not ended:  # past the grace: kill what is left
            for worker in pending:
                log.error("worker %s did not stop within %.0f s: killing it", worker.name, grace_s)
                worker.kill()
                worker.join()
            return 1
        for worker in [w for w in pending if w.sentinel in ended]:
            worker.join()
            pending.remove(worker)
            if not stopping:
                log.error("worker %s exited (status %s): stopping the others", worker.name, worker.exitcode)
                code = worker.exitcode if worker.exitcode and worker.exitcode > 0 else 1
                stop()
            elif worker.exitcode != 0:
                code = code or 1
    return code


def _worker(serve: Callable[[ServerSettings], None], settings: ServerSettings) -> None:
    """A worker process's body: logging as `rlgate` sets it up, and a user error as its one line."""
    setproctitle.setproctitle(f"rlgate serve: worker {settings.server_id}")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    stop_with_parent()
    try:
        serve(settings)
    except UserError as exc:
        print(f"rlgate: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        sys.exit(USAGE_ERROR)
