"""Transport security shared by the gRPC services: bearer-token check and TLS credentials."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

# Probes (grpc_health_probe, Kubernetes) cannot send a token; health reveals nothing, so it stays open.
OPEN_METHODS_PREFIX = "/grpc.health.v1.Health/"


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Ends every call without `authorization: Bearer <token>` with UNAUTHENTICATED."""

    def __init__(self, token: str, on_reject: Callable[[], None] = lambda: None) -> None:
        self._expected = f"Bearer {token}".encode()
        self._on_reject = on_reject

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHODS_PREFIX):
            return handler
        sent = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(sent).encode(), self._expected):
            return handler
        self._on_reject()
        return _deny(handler, "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'")


def _deny(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that aborts at once."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(abort)


def server_credentials(cert: Path, key: Path, client_ca: Path | None = None) -> grpc.ServerCredentials:
    """TLS for a server port; with client_ca, clients must present a certificate signed by it (mTLS)."""
    return grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=client_ca.read_bytes() if client_ca else None,
        require_client_auth=client_ca is not None,
    )


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata that carries the token (empty when there is none)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
