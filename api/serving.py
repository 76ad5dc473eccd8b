"""What `hetplan serve` hands to uvicorn beyond the app.

`NoDelayHTTPProtocol` turns Nagle's algorithm off on every accepted connection. asyncio
does that itself only for sockets it recognises as TCP, and the listening socket that
uvicorn shares between worker processes (`--workers N`) is not recognised (its `proto`
is 0): every keep-alive answer then waited for the client's delayed ACK, about 40 ms
(measured: 44 ms per request on loopback with two workers, 1 ms with this protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from uvicorn.protocols.http.auto import AutoHTTPProtocol

__all__ = ["NoDelayHTTPProtocol", "PROTOCOL_PATH"]

PROTOCOL_PATH = "api.serving:NoDelayHTTPProtocol"


class NoDelayHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # not TCP after all: nothing to turn off
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)  # type: ignore[arg-type]
