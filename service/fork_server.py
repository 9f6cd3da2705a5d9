"""Worker processes started from a fork server: one process that imported what they import, forking each.

`rlgate env`'s clients and `rlgate serve --workers`' workers were spawned, and each imported gRPC, gymnasium and
(for a server or a local client) torch again: ~1.3-3.5 CPU-s a process. multiprocessing's fork server is exec'd
like a spawned child, imports the modules named once, and forks every process from there, while it holds no gRPC
object, thread or event loop (forking a process that may hold gRPC threads is what spawn avoided). Its children
take the signal dispositions it started with: start the first process where they should be inherited.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterable
from multiprocessing.context import ForkServerContext


def fork_server(preload: Iterable[str]) -> ForkServerContext:
    """The multiprocessing context whose processes fork from a server that imported `preload` first."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    return context
