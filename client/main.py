"""`rlgate env`: K env-client processes against one server, with one progress bar for all of them.

A client that meets a user's mistake (an env id that does not exist, a server that refuses the env's
spaces or the token, an address where no server answers) reports the message to this process, which ends
the others and raises it once as a UserError (one line, exit 2), however many clients met it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import queue
import signal
import time
from collections import deque
from statistics import fmean
from typing import TYPE_CHECKING

from tqdm import tqdm

from rlgate.client.settings import ClientSettings
from rlgate.core.errors import UserError
from rlgate.service.fork_server import fork_server

if TYPE_CHECKING:
    from rlgate.client.env_client import ClientStats

log = logging.getLogger(__name__)

REPORT_EVERY_S = 0.5
# What a client process imports (`_client_process`), imported once by the fork server that starts them.
CLIENT_MODULES = ("rlgate.client.env_client", "rlgate.service.process", "rlgate.spec.env", "rlgate.spec.imports")
LOCAL_MODULES = ("torch", "rlgate.client.local")  # a client that acts


def run_clients(settings: ClientSettings) -> int:
    """Start the client processes, show progress, end them all on Ctrl-C; exit code 0 when all succeeded."""
    log.info("%s", settings.preset_line())
    signal.signal(signal.SIGTERM, _interrupt)  # `docker stop` and `kill` end the clients like Ctrl-C does
    context = fork_server([*CLIENT_MODULES, *(LOCAL_MODULES if settings.inference == "local" else ())])
    reports: mp.Queue = context.Queue()
    # Not daemonic: a client may start processes of its own (vectorize = "async"), which a daemon may not.
    # This process ends them instead, in `finally` below, whatever ends it.
    processes = [
        context.Process(target=_client_process, args=(settings, i, reports)) for i in range(settings.num_clients)
    ]
    # Inherited (the fork server starts within, and its children take its dispositions): Ctrl-C stops them (and
    # theirs) through us.
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for p in processes:
            p.start()
    finally:
        signal.signal(signal.SIGINT, interrupt)
    steps = [0] * len(processes)
    returns: deque[float] = deque(maxlen=100)
    errors: dict[str, None] = {}  # the clients' user errors, each message once, in order
    # On a terminal only (disable=None): no carriage-return runs in a log file or pipe.
    bar = tqdm(
        total=settings.max_steps * len(processes) or None, unit="step", disable=None if settings.progress else True
    )
    try:
        while any(p.is_alive() for p in processes) or not reports.empty():
            try:
                index, env_steps, new_returns, version, error = reports.get(timeout=REPORT_EVERY_S)
            except queue.Empty:
                continue
            if error is not None:
                errors[error] = None
                _terminate(processes)  # the others would meet it too, or run without the one that failed
                continue
            bar.update(env_steps - steps[index])
            steps[index] = env_steps
            returns.extend(new_returns)
            bar.set_postfix(mean_return=f"{fmean(returns):.1f}" if returns else "-", model_version=version)
    except KeyboardInterrupt:
        log.info("Ctrl-C: stopping %d clients", len(processes))
    finally:
        bar.leave = not errors  # an error replaces the bar
        bar.close()
        _terminate(processes)  # none is left running, however this loop ended
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise UserError("; ".join(errors))
    return 0 if all(p.exitcode == 0 for p in processes) else 1


def _terminate(processes: list) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _client_process(settings: ClientSettings, index: int, reports: mp.Queue) -> None:
    """One client process: runs until max_steps or SIGTERM (the parent's, at Ctrl-C too), then closes its stream.

    `settings` arrive as the parent's object (the token in them too: a JSON dump would mask it). The client's
    own modules (gRPC, numpy, gymnasium) are imported here, and by the fork server before it (CLIENT_MODULES):
    the parent, which only starts and watches the clients, starts faster without them.
    """
    import setproctitle

    from rlgate.client.env_client import EnvClient
    from rlgate.service.process import ignore_stop_signals, on_stop_signals
    from rlgate.spec.env import make_agent_envs, make_env
    from rlgate.spec.imports import ImportPolicy

    setproctitle.setproctitle(f"rlgate env: client {index + 1} of {settings.num_clients}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    env = settings.spec.env
    n, seed = env.num_envs, settings.spec.seed
    reported = {"at": 0.0, "episodes": 0}

    def report(stats: ClientStats, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - reported["at"] >= REPORT_EVERY_S:
            fresh = stats.episodes - int(reported["episodes"])
            recent = list(stats.returns)[-fresh:] if fresh else []
            reports.put((index, stats.env_steps, recent, stats.model_version, None))
            reported.update(at=now, episodes=stats.episodes)

    imports = ImportPolicy(settings.spec.modules())  # the operator's own spec: its env may be imported
    try:
        if settings.inference == "local":
            import torch  # the client acts: torch is imported anyway (client/local.py)

            torch.set_num_threads(settings.torch_threads)
        client = EnvClient(
            make_agent_envs(env, imports) if settings.spec.multi_agent else make_env(env, imports),
            settings.server,
            client_id=f"{env.id}-{index}",
            explore=settings.explore,
            seed=None if seed is None else seed + index * n,
            token=settings.bearer_token(),
            tls_ca=settings.tls_ca,
            connect_timeout_s=settings.connect_timeout_s or None,
            on_step=report,
            inference=settings.inference,
            allow_import=[*settings.allow_import, *imports.allowed],  # as a server: what its own spec names too
            spool_dir=settings.spool_dir,
            max_spool_bytes=settings.max_spool,
            drain_timeout_s=settings.drain_timeout_s,
            backend=settings.backend,
        )

        async def main() -> None:
            on_stop_signals(client.stop)
            try:
                await client.run(settings.max_steps)
            finally:
                ignore_stop_signals()  # done, however it ended (below)

        asyncio.run(main())
        error = None
    except UserError as exc:  # the parent says it once, for all clients (module docstring)
        error = str(exc)
    # Done: the parent may now end this process, but not halfway through the last report (a message torn
    # in the queue's pipe would hang the parent's next read). It waits for this process to exit.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if error is not None:
        reports.put((index, 0, [], -1, error))
        raise SystemExit(2)
    report(client.stats, force=True)


def main(argv: list[str]) -> int:
    return run_clients(ClientSettings(_cli_parse_args=argv, _cli_prog_name="rlgate env"))
