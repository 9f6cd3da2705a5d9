"""A gRPC client that stops taking answers: HTTP/2 spoken by hand, granting the server a flow-control window of a
few bytes and never more, as a client that reads no answers does (grpc's own clients keep reading into memory).

It acknowledges the server's SETTINGS and PINGs, so the connection itself stays healthy."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from support.servers import CONNECT

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _SETTINGS, _PING = 0, 1, 4, 6
_ACK, _END_HEADERS = 1, 4
_INITIAL_WINDOW_SIZE = 4


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _header(name: str, value: str) -> bytes:
    """HPACK: a literal header field without indexing, new name, no Huffman coding (both under 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


@asynccontextmanager
async def stalled_stream(port: int, messages: list[bytes], window: int) -> AsyncIterator[None]:
    """A Connect stream to 127.0.0.1:`port` that sends `messages` at once and takes at most `window` bytes of
    answers (gRPC-framed) before it stops reading; closed on exit."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = [(":method", "POST"), (":scheme", "http"), (":path", CONNECT), (":authority", "rlgate")]
    headers += [("content-type", "application/grpc"), ("te", "trailers")]
    writer.write(_PREFACE + _frame(_SETTINGS, 0, 0, struct.pack(">HI", _INITIAL_WINDOW_SIZE, window)))
    writer.write(_frame(_HEADERS, _END_HEADERS, 1, b"".join(_header(k, v) for k, v in headers)))
    for message in messages:
        writer.write(_frame(_DATA, 0, 1, b"\x00" + struct.pack(">I", len(message)) + message))

    async def acknowledge() -> None:
        while True:
            head = await reader.readexactly(9)
            payload = await reader.readexactly(int.from_bytes(head[:3], "big"))
            kind, flags = head[3], head[4]
            if kind in (_SETTINGS, _PING) and not flags & _ACK:  # a PING's acknowledgement echoes it
                writer.write(_frame(kind, _ACK, 0, payload if kind == _PING else b""))

    task = asyncio.create_task(acknowledge())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        writer.close()
