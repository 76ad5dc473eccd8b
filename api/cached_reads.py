"""Stored-plan reads answered from the plan cache before routing.

A cached `GET /v1/plans/{id}` is the service's hottest request, and its answer is bytes
already encoded. Routing it (FastAPI tries the routes in turn, in Python) and solving its
dependencies cost about four fifths of the server's CPU per read (cProfile, in process:
314 us a read through the routes, about 20 us here), so `CachedPlanReads` answers a cache
hit itself, with the same status, headers and body as the route. Anything else (a miss, a token the
route would refuse, another path or method) goes on to the app unchanged, so every
error is still the route's own answer.
"""

from __future__ import annotations

import re

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import authorize, bearer_token_of
from api.cache import LruCache
from api.errors import ApiError
from api.settings import Settings

__all__ = ["CachedPlanReads"]

_PLAN_PATH = re.compile(r"/v1/plans/([0-9a-f]+)")
"""The path of `get_plan` (its `hexid` convertor); no other GET route takes such a path
(a test checks)."""


class CachedPlanReads:
    """Answers `GET /v1/plans/{id}` with the cached encoded plan when the cache holds it
    and the caller may read; `route` (the `get_plan` route) goes into the scope as
    routing would put it, so the metrics count the read under its route template."""

    def __init__(self, app: ASGIApp, *, cache: LruCache, settings: Settings,
                 route: BaseRoute) -> None:
        self.app = app
        self.cache = cache
        self.settings = settings
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        encoded = self._cached_answer(scope)
        if encoded is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(encoded)).encode()),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": encoded})

    def _cached_answer(self, scope: Scope) -> bytes | None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope.get("root_path"):
            return None
        found = _PLAN_PATH.fullmatch(scope["path"])
        if found is None:
            return None
        encoded = self.cache.get(found[1])
        if encoded is None or not self._may_read(scope):
            return None
        return encoded

    def _may_read(self, scope: Scope) -> bool:
        if not self.settings.tokens:
            return True
        authorization = next((value.decode("latin-1") for name, value in scope["headers"]
                              if name == b"authorization"), None)
        try:
            authorize(self.settings, bearer_token_of(authorization), None)
        except ApiError:  # the route answers the 401 itself
            return False
        return True
