"""Bearer tokens with scopes, configured by the operator in `Settings.tokens`.

With no tokens configured everyone may do everything (the CLI refuses to serve that on
a reachable address unless told to run open). With tokens, writes need a token holding
the route's scope (or `admin`), and reads need any valid token when
`read_requires_token` is set.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from api.errors import Forbidden, Unauthorized
from api.route_table import flat_routes
from api.settings import Scope, Settings

__all__ = [
    "Principal",
    "Requirement",
    "require",
    "authorize",
    "bearer_token",
    "bearer_token_of",
    "required_scope",
    "openapi_as_configured",
]

_bearer = HTTPBearer(auto_error=False, description="A token from HETPLAN_TOKENS.")


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who is asking: the scopes of their token (all scopes when auth is off)."""

    scopes: frozenset[Scope]
    authenticated: bool


def authorize(settings: Settings, token: str | None, needed: Scope | None) -> Principal:
    """The caller's principal, or `Unauthorized`/`Forbidden` saying what is missing.
    `needed=None` means a read."""
    if not settings.tokens:
        return Principal(scopes=frozenset(Scope), authenticated=False)
    scopes = _scopes_of(settings, token)
    if scopes is None:
        if needed is None and not settings.read_requires_token and token is None:
            return Principal(scopes=frozenset(), authenticated=False)
        raise Unauthorized("a valid bearer token is required: send 'Authorization: Bearer "
                           "TOKEN' with a token the operator put in HETPLAN_TOKENS"
                           if token is None else "the bearer token is not known to this "
                           "server; check it against HETPLAN_TOKENS")
    if needed is not None and needed not in scopes and Scope.ADMIN not in scopes:
        raise Forbidden(f"this token lacks the {needed.value!r} scope (it has "
                        f"{sorted(s.value for s in scopes)}); ask the operator to add it")
    return Principal(scopes=frozenset(scopes), authenticated=True)


def _scopes_of(settings: Settings, token: str | None) -> list[Scope] | None:
    if token is None:
        return None
    found = None
    for known, scopes in settings.tokens.items():
        # compare every token in constant time, so timing does not reveal a prefix
        if hmac.compare_digest(known.encode(), token.encode()):
            found = scopes
    return found


@dataclass(frozen=True)
class Requirement:
    """What a route's auth dependency asks for (`scope` None: any reader)."""

    scope: Scope | None


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, read as `HTTPBearer` does."""
    return bearer_token_of(request.headers.get("Authorization"))


def bearer_token_of(authorization: str | None) -> str | None:
    """The token of an `Authorization` header's value, or None if it is not `Bearer`."""
    scheme, token = get_authorization_scheme_param(authorization)
    return token if scheme.lower() == "bearer" and token else None


def required_scope(dependant: Dependant) -> Requirement | None:
    """The requirement of the `require(...)` dependency among a route's, if it has one."""
    for sub in dependant.dependencies:
        found = getattr(sub.call, "requirement", None) or required_scope(sub)
        if found is not None:
            return found
    return None


def require(needed: Scope | None):  # type: ignore[no-untyped-def]
    """A dependency that admits callers with `needed` (None: any reader)."""

    async def dependency(  # async: pure CPU, so no thread-pool hop per request
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        settings: Settings = request.app.state.settings
        token = credentials.credentials if credentials is not None else None
        return authorize(settings, token, needed)

    dependency.requirement = Requirement(needed)  # type: ignore[attr-defined]
    return dependency


def _needs_token(requirement: Requirement | None, settings: Settings) -> bool:
    if requirement is None or not settings.tokens:
        return False
    return requirement.scope is not None or settings.read_requires_token


def openapi_as_configured(app: FastAPI, settings: Settings) -> Callable[[], dict[str, Any]]:
    """`app.openapi` declaring bearer security only on operations that need a token with
    these settings: none without tokens, writes with tokens, reads too when
    `read_requires_token` is set. A client (or schemathesis) then knows what to send."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        for route in flat_routes(app.router.routes):
            if not isinstance(route, APIRoute):
                continue
            needs = _needs_token(required_scope(route.dependant), settings)
            for method in route.methods or ():
                operation = schema["paths"].get(route.path_format, {}).get(method.lower())
                if operation is not None and not needs:
                    operation.pop("security", None)
        if not settings.tokens:
            schema.get("components", {}).pop("securitySchemes", None)
        return schema

    return openapi
