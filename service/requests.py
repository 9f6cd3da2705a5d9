"""A generated servicer's methods registered to take their requests as bytes, parsed here: bytes that are no
message of the method's request type end the call with INVALID_ARGUMENT naming that type.

gRPC's generated registration parses requests before the servicer sees them, and a request that does not parse
ends the call with UNKNOWN (or INTERNAL): nothing a client written from the proto alone, in another language,
can tell from a fault of the service.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

M = TypeVar("M", bound=Message)

_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def parsing_handler(service: ServiceDescriptor, servicer: object) -> grpc.GenericRpcHandler:
    """The handler for every method of `service` (a proto service's descriptor) on `servicer` (an instance of
    its generated servicer class), whose requests are parsed by `parse`."""
    handlers = {}
    for method in service.methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        behaviour = _parsing(getattr(servicer, method.name), request, method.client_streaming)
        kind = _KINDS[method.client_streaming, method.server_streaming]
        handlers[method.name] = kind(behaviour, response_serializer=response.SerializeToString)  # bytes in
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


class NotAMessage(ValueError):
    """Bytes that are no message of the expected type; the message names the type, for the client."""


def from_bytes(message_type: type[M], raw: bytes) -> M:
    """`raw` as a `message_type`; NotAMessage naming the type when the bytes are none."""
    try:
        return message_type.FromString(raw)
    except DecodeError as exc:
        raise NotAMessage(f"not a valid {message_type.DESCRIPTOR.full_name}: {exc}") from exc


async def parse(message_type: type[M], raw: bytes, context: grpc.aio.ServicerContext) -> M:
    """`raw` as a `message_type`; bytes that are none end the call with INVALID_ARGUMENT naming the type."""
    try:
        return from_bytes(message_type, raw)
    except NotAMessage as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("context.abort raises") from exc  # grpc has no types that say so


def _parsing(behaviour: Callable[..., Any], message_type: type[Message], streaming: bool) -> Callable[..., Any]:
    """`behaviour` (an async servicer method: a coroutine, or an async generator of responses) taking its request,
    or its stream of requests, as bytes."""

    async def requests(raw: Any, context: grpc.aio.ServicerContext) -> Any:
        return _parse_each(message_type, raw, context) if streaming else await parse(message_type, raw, context)

    if inspect.isasyncgenfunction(behaviour):

        async def responses(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
            async for response in behaviour(await requests(raw, context), context):
                yield response

        return responses

    async def response(raw: Any, context: grpc.aio.ServicerContext) -> Message:
        return await behaviour(await requests(raw, context), context)

    return response


async def _parse_each(
    message_type: type[M], raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[M]:
    async for raw in raws:
        yield await parse(message_type, raw, context)
