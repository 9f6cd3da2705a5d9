"""Processes started from a fork server: one process that imported what they import, forking each.

`rlgate up`'s learner, server and env clients, `rlgate env`'s clients and `rlgate serve --workers`' workers were
spawned, and each imported gRPC, gymnasium and (for a learner, a server or a local client) torch again: ~1.3-3.5
CPU-s a process. multiprocessing's fork server is exec'd like a spawned child, imports the modules named once,
and forks every process from there, while it holds no gRPC object, thread or event loop (forking a process that
may hold gRPC threads is what spawn avoided). Its children take the signal dispositions and the signal mask it
started with: start the first process where they should be inherited. A forked process shows the fork server's
command line until it names itself (`setproctitle`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Iterable
from multiprocessing.connection import wait
from multiprocessing.context import ForkServerContext


def fork_server(preload: Iterable[str]) -> ForkServerContext:
    """The multiprocessing context whose processes fork from a server that imported `preload` first."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    return context


def stop_with_parent() -> None:
    """In a forked process: SIGTERM it when the process that started it is gone (even killed with SIGKILL), so it
    stops as on a stop signal, draining and flushing, instead of running on with no one to stop it. Its parent
    in the process tree is the fork server; this watches the process that asked for it (a pipe that closes)."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rlgate-parent-watch", daemon=True).start()
