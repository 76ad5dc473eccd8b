"""`CheckedRoute`: what every /v1 route does before FastAPI reads its body.

1. Authorize from the headers alone, so a caller without the route's scope gets its
   401/403 before the server spends time decoding (up to `max_body_bytes` of) JSON.
2. Check the decoded JSON body whole, free-form parts included (`source`, `scenario`,
   `plan`): every number finite and every string encodable as UTF-8. Python's decoder
   accepts `NaN`, `Infinity`, `1e999` and lone surrogate escapes (`"\\udfff"`) that no
   database column and no JSON answer can hold; refused here, they never reach a
   transaction, so nothing stored can later fail to be answered.

Bodies FastAPI itself cannot decode are left to it (it answers 422 or 400).
"""

from __future__ import annotations

import email.message
import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from api.auth import authorize, bearer_token, required_scope

__all__ = ["CheckedRoute", "first_unstorable_value", "is_json", "unstorable_value_in"]

_MAYBE_UNSTORABLE = re.compile(rb"NaN|Infinity|\\u[dD][89abcdefABCDEF]|[eE]\+?\d{3}|\d{300}")
"""Byte patterns without which the decoded body cannot hold a non-finite number (NaN,
Infinity, an exponent or mantissa past float range) or a lone surrogate (only an escape
can make one: raw bytes are decoded strictly). Bodies without them skip the walk."""


def first_unstorable_value(document: Any) -> tuple[tuple[str | int, ...], str, Any] | None:
    """(path, reason, value) of the first value in `document` that is not a finite number
    or not valid Unicode, or None. Iterative, so any nesting json.loads accepted is fine."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path, "Input should be a finite number", value
        if isinstance(value, str) and not _is_unicode(value):
            return path, "Input should be valid Unicode (a lone surrogate escape is not)", None
        if isinstance(value, dict):
            for key, item in value.items():
                if not _is_unicode(key):
                    return path, "Keys should be valid Unicode (a lone surrogate is not)", None
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value))
    return None


def unstorable_value_in(body: bytes, document: Any) -> tuple[tuple[str | int, ...], str, Any] | None:
    """`first_unstorable_value(document)` of a body decoded from `body`, skipping the walk
    when the bytes cannot hold one."""
    return first_unstorable_value(document) if _MAYBE_UNSTORABLE.search(body) else None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_json(request: Request) -> bool:
    """Whether the request says its body is JSON (`application/json` or `...+json`)."""
    content_type = request.headers.get("content-type")
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json"))


async def _check_body(request: Request) -> None:
    body = await request.body()
    if not body or not is_json(request):
        return
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # FastAPI answers these itself
        return
    found = unstorable_value_in(body, document)
    if found is not None:
        path, reason, value = found
        raise RequestValidationError([{"type": "value_error", "loc": ("body", *path),
                                       "msg": reason, "input": value}])
    request._json = document  # noqa: SLF001 - starlette's cache: FastAPI decodes it once


class CheckedRoute(APIRoute):
    """An `APIRoute` that authorizes, then checks the body whole, then runs FastAPI's
    usual handler (which validates the body against its model)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        needed = required_scope(self.dependant)
        has_body = self.body_field is not None

        async def checked(request: Request) -> Response:
            if needed is not None:
                authorize(request.app.state.settings, bearer_token(request), needed.scope)
            if has_body:
                await _check_body(request)
            return await handler(request)

        return checked
