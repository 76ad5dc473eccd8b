"""Admission control for inline plan searches.

Inline searches (201 answers) run on the thread pool that also serves every other
synchronous route. Without a bound, 64 concurrent plan requests filled it and every read
queued behind them; now at most `limit` run at once per process and the next request is
refused at once (503 `overloaded`, `Retry-After`), before it reads the database or takes
a thread. The count lives on the event loop, the only place that changes it.

A burst of plan requests is mostly refusals, each answered on the event loop that also
answers `/readyz`: `RefuseWhenFull` gives them the route's answer before routing, for a
fraction of the loop's time (FastAPI's routing, dependencies and exception handlers were
most of a refusal's cost).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from api import schemas
from api.auth import Scope as TokenScope
from api.auth import authorize, bearer_token
from api.errors import Overloaded, error_response
from api.limits import replaying
from api.routing import is_json, unstorable_value_in
from api.services import planning
from api.settings import Settings

__all__ = ["InlineSolves", "RefuseWhenFull"]

T = TypeVar("T")


class InlineSolves:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0

    @property
    def full(self) -> bool:
        return self.running >= self.limit

    def overloaded(self) -> Overloaded:
        return Overloaded(f"{self.running} inline plan searches are already running on this "
                          f"server (max_inline_solves = {self.limit}); retry after the "
                          "Retry-After delay, or ask for a job with ?job=true")

    async def run(self, work: Callable[[], T]) -> T:
        """`work()` on the thread pool, or `Overloaded` when `limit` are already running."""
        if self.full:
            raise self.overloaded()
        self.running += 1
        try:
            return await run_in_threadpool(work)
        finally:
            self.running -= 1


class RefuseWhenFull:
    """Answers `POST /v1/plans` with the route's own 503 `overloaded` (same status,
    headers and body) while `solves` are full, when the route would surely refuse it: a
    token with the `plan` scope (or none needed), a JSON body the route accepts, no query
    (`?job=true` asks for a job), no goal in money (its budget needs the scenario) and a
    time limit the route answers inline. Anything else goes on to the app unchanged, so
    every other answer is still the route's. `route` (`create_plan`) goes into the scope
    as routing would put it, so the metrics count the refusal under its template."""

    def __init__(self, app: ASGIApp, *, solves: InlineSolves, settings: Settings,
                 route: BaseRoute) -> None:
        self.app = app
        self.solves = solves
        self.settings = settings
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (self.solves.full and _is_plain_plan_request(scope)):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        request = Request(scope)
        if self.solves.full and self._surely_inline(request, body):
            scope["route"] = self.route
            await error_response(request, self.solves.overloaded())(scope, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)

    def _surely_inline(self, request: Request, body: bytes) -> bool:
        """Whether the route would take this request as valid and search it inline."""
        if not body or not is_json(request):
            return False
        try:
            authorize(self.settings, bearer_token(request), TokenScope.PLAN)
            document = json.loads(body)
            if unstorable_value_in(body, document) is not None:
                return False
            options = planning.plan_options(
                schemas.PlanRequest.model_validate(document).options, self.settings)
        except Exception:  # the route gives this request its own answer
            return False
        return (not planning.has_goal(options)
                and planning.answers_inline(options.time_limit_s, self.settings))


def _is_plain_plan_request(scope: Scope) -> bool:
    return (scope["type"] == "http" and scope["method"] == "POST"
            and scope["path"] == "/v1/plans" and not scope.get("root_path")
            and not scope.get("query_string"))
