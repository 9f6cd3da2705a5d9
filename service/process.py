"""What every rlgate service process does the same way: its gRPC server, and running until a signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rlgate.core.errors import UserError
from rlgate.service.auth import TokenInterceptor, server_credentials
from rlgate.service.channel import SERVER_OPTIONS

log = logging.getLogger(__name__)


async def start_grpc_server(
    service_name: str,
    register: Callable[[grpc.aio.Server], None],
    health_servicer: health.aio.HealthServicer,
    *,
    address: str,
    max_message_bytes: int,
    token: str | None = None,
    on_reject: Callable[[], None] = lambda: None,
    tls: tuple[Path, Path, Path | None] | None = None,
    reuse_port: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """A started grpc.aio server with the service, health checking and reflection; returns it and its port.

    `tls` is (certificate chain, private key, client CA for mTLS or None); `token` turns on bearer auth.
    A port in use raises UserError. gRPC would share it by default (SO_REUSEPORT), splitting clients
    between two servers without a word; `reuse_port` shares it on purpose (worker processes of one server).
    """
    if not reuse_port:
        host, _, port = address.rpartition(":")
        ensure_free(host.strip("[]"), int(port), "--port")
    interceptors = [TokenInterceptor(token, on_reject=on_reject)] if token else []
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", int(reuse_port)),
            *SERVER_OPTIONS,
        ],
    )
    register(server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        if tls is not None:
            bound = server.add_secure_port(address, server_credentials(*tls))
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # taken since ensure_free looked, or an address this host does not have
        raise UserError(f"cannot listen on {address} (--port): {exc}") from None
    await server.start()
    for name in ("", service_name):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


def bind(host: str, port: int, flag: str) -> socket.socket:
    """A listening TCP socket on host:port (0: a free port); UserError naming `flag` when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, reuse_port=False)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise UserError(
            f"cannot listen on {host}:{port} ({flag}): {reason}; pick another {flag} (0: any free port)"
        ) from None


def ensure_free(host: str, port: int, flag: str) -> None:
    """UserError unless host:port can be listened on now (port 0 always can)."""
    if port:
        bind(host, port, flag).close()


def reserve_shared_port(host: str, port: int, flag: str) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket on host:port (0: a free port), for worker processes to
    listen on beside it (`start_grpc_server(reuse_port=True)`). Held while they run, it keeps every other
    process from listening there, and the port is first checked to be free: nothing else shares it."""
    ensure_free(host, port, flag)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # taken since ensure_free looked
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({flag}): {os.strerror(exc.errno or 0)}") from None
    return sock


def on_stop_signals(stop: Callable[[], None]) -> None:
    """Call `stop` on the running loop at SIGTERM, and at Ctrl-C (SIGINT) unless this process started with
    SIGINT ignored: then a parent (`rlgate up`) that gets the terminal's Ctrl-C stops it, in its own order."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        loop.add_signal_handler(signal.SIGINT, stop)


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and Ctrl-C from now on; call it on the loop that `on_stop_signals` set up, before it ends.

    The loop's handlers go while it still runs: a signal that arrives while `asyncio.run` closes the loop would
    otherwise be written to its closed wakeup pipe, and Python prints a traceback for it to stderr. Between
    asyncio's removal (which restores the default action) and SIG_IGN a signal still ends the process, as it
    did anywhere in the loop's close before: a window of two calls, where a process being stopped has nothing
    left to lose but its exit status.
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)


class Service(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def run_until_signal(make: Callable[[], Service]) -> None:
    """Make and start the service, run until SIGTERM or Ctrl-C, then stop it gracefully.

    The service is made inside the running loop: gRPC channels and asyncio primitives bind to it.
    """
    service = make()
    await service.start()
    stopping = asyncio.Event()
    on_stop_signals(stopping.set)
    await stopping.wait()
    ignore_stop_signals()  # one is enough: the service stops in order
    log.info("signal received: stopping")
    await service.stop()


def process_started() -> float:
    """When this process started, on the `time.monotonic()` clock (Linux: from /proc; elsewhere: now)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return time.monotonic()
    return time.monotonic() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
