"""Request body size limit, enforced before any route reads the body."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import BodyTooLarge, error_body
from planner.errors import Problem

__all__ = ["BodyLimitMiddleware", "replaying"]


class BodyLimitMiddleware:
    """Answers 413 to bodies above `max_bytes`, whether announced by Content-Length or
    streamed in chunks, without handing any of it to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replaying(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = BodyTooLarge(f"the request body is larger than this server's limit of "
                             f"{self.max_bytes} bytes (HETPLAN_MAX_BODY_BYTES); split the "
                             "upload into smaller batches",
                             problems=[Problem(path="(body)", message="larger than "
                                               f"{self.max_bytes} bytes")])
        response: Any = JSONResponse(error_body(error), status_code=413,
                                     headers={"Connection": "close"})
        await response(scope, receive, send)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app `body` (already read) whole, then the client's own
    messages (a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
