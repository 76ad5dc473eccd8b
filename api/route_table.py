"""The app's routes as one flat list, whichever way FastAPI keeps included routers."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute

__all__ = ["flat_routes"]


def flat_routes(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """`routes` with included routers opened (FastAPI >= 0.120 keeps them whole; older
    versions copy every route into the app's own list)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return list(routes)
    return [context.original_route for context in iter_route_contexts(routes)]
