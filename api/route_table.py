"""The app's routes as one flat list, whichever way FastAPI keeps included routers."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

__all__ = ["flat_routes", "add_routes"]


def flat_routes(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """`routes` with included routers opened (FastAPI >= 0.120 keeps them whole; older
    versions copy every route into the app's own list)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return list(routes)
    return [context.original_route for context in iter_route_contexts(routes)]


def add_routes(app: FastAPI, router: APIRouter) -> None:
    """Put `router`'s routes, in order, into the app's own route list.

    `app.include_router` would do the same with FastAPI < 0.120; later versions keep the
    router whole and, on every request, walk each included router's routes in Python
    (saving and restoring scope keys around each match): about a quarter of the CPU of
    a small request here (cProfile, in process). The service's routers take no include
    options (their prefix, tags and responses are given where each is made, and already
    in their routes), so the routes answer, and document themselves, as included."""
    assert not router.on_startup and not router.on_shutdown, "the app would not run them"
    app.router.routes.extend(router.routes)
