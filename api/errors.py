"""The service's errors and the one place where every error becomes an HTTP answer.

    ApiError                     raised by the service's own layers (routes, storage, jobs)
    ├── NotFound                 404  an id or name in the URL is not stored
    ├── Conflict                 409  the request does not fit the resource's state
    ├── InvalidRequest           422  a body names something unknown or contradicts itself
    │   ├── IdempotencyKeyReused 422  same Idempotency-Key, different body
    │   ├── ScenarioTooLarge     422  more layers or GPUs than the server plans
    │   └── SearchMemoryExceeded 422  a search needed more than its memory bound
    ├── Unauthorized             401  no or unknown bearer token
    ├── Forbidden                403  the token lacks the scope
    ├── BodyTooLarge             413  body above `max_body_bytes`
    ├── Conflict                 409  concurrent uploads kept colliding (Retry-After)
    ├── Overloaded               503  too many pending plan jobs (Retry-After)
    ├── StorageUnavailable       503  the database cannot be reached (Retry-After)
    ├── SearchCrashed            503  a search process died without an answer (Retry-After)
    └── ExportUnavailable        501  the export module is not installed

The planner core's `PlannerError` family and FastAPI's request validation errors are
mapped here too (`error_body`), so routes and the job runner never build error answers.
Every answer has the same shape: `{"error": code, "message": str, "problems": [...]}`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.route_table import flat_routes
from planner.errors import (
    Infeasible,
    InvalidPlan,
    InvalidScenario,
    MissingProfile,
    PlannerError,
    Problem,
    SolverTimeout,
    UnsupportedExport,
)

__all__ = [
    "ApiError",
    "NotFound",
    "Conflict",
    "InvalidRequest",
    "IdempotencyKeyReused",
    "ScenarioTooLarge",
    "SearchMemoryExceeded",
    "Unauthorized",
    "Forbidden",
    "BodyTooLarge",
    "Conflict",
    "Overloaded",
    "StorageUnavailable",
    "SearchCrashed",
    "rendered_error",
    "ExportUnavailable",
    "error_body",
    "error_status",
    "error_headers",
    "error_response",
    "install_error_handlers",
    "json_safe",
]

log = logging.getLogger("hetplan.api")


class ApiError(Exception):
    """Base of the service's own errors; `status` and `code` say how it is answered, and
    `retry_after_s`, when set, is sent as `Retry-After`: the request may succeed later."""

    status = 400
    code = "bad_request"
    retry_after_s: int | None = None

    def __init__(self, message: str, *, problems: Sequence[Problem] = (), **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.problems = list(problems)
        self.extra = extra


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class InvalidRequest(ApiError):
    status = 422
    code = "invalid_request"


class IdempotencyKeyReused(InvalidRequest):
    code = "idempotency_key_reused"


class ScenarioTooLarge(InvalidRequest):
    code = "scenario_too_large"


class SearchMemoryExceeded(InvalidRequest):
    code = "search_memory_exceeded"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class Forbidden(ApiError):
    status = 403
    code = "forbidden"


class BodyTooLarge(ApiError):
    status = 413
    code = "body_too_large"


class UploadCollision(Conflict):
    """Concurrent writers of one key kept colliding: retrying later succeeds."""

    retry_after_s = 1


class Overloaded(ApiError):
    status = 503
    code = "overloaded"
    retry_after_s = 1


class StorageUnavailable(ApiError):
    status = 503
    code = "storage_unavailable"
    retry_after_s = 5


class SearchCrashed(ApiError):
    status = 503
    code = "search_crashed"
    retry_after_s = 5


def rendered_error(status: int, body: dict[str, Any]) -> ApiError:
    """An error answered exactly as `body` with `status` (rendered elsewhere, e.g. in the
    process that ran a search)."""
    extra = {k: v for k, v in body.items() if k not in ("error", "message", "problems")}
    problems = [Problem(path=p["path"], message=p["message"], value=p.get("value"))
                for p in body.get("problems", [])]
    error = ApiError(body.get("message", ""), problems=problems, **extra)
    error.status, error.code = status, body.get("error", "internal")
    return error


class ExportUnavailable(ApiError):
    status = 501
    code = "export_unavailable"


_PLANNER_CODES: list[tuple[type[PlannerError], str]] = [
    (InvalidScenario, "invalid_scenario"),
    (InvalidPlan, "invalid_plan"),
    (MissingProfile, "missing_profile"),
    (Infeasible, "infeasible"),
    (SolverTimeout, "solver_timeout"),
    (UnsupportedExport, "unsupported_export"),
    (PlannerError, "planner_error"),
]


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats replaced by their names, so any JSON encoder (and
    PostgreSQL's json type) accepts it; containers are copied, other objects become str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return str(value)


def _problem(problem: Problem) -> dict[str, Any]:
    out: dict[str, Any] = {"path": problem.path, "message": problem.message}
    if problem.value is not None:
        out["value"] = json_safe(problem.value)
    return out


def error_status(error: Exception) -> int:
    """HTTP status of an error the service answers (500 for anything unexpected)."""
    if isinstance(error, ApiError):
        return error.status
    if isinstance(error, PlannerError):
        return 422
    if isinstance(error, OperationalError):
        return 503
    return 500


def error_body(error: Exception) -> dict[str, Any]:
    """The JSON answer for `error`: stable `error` code, readable `message`, `problems`."""
    if isinstance(error, ApiError):
        body = {"error": error.code, "message": error.message,
                "problems": [_problem(p) for p in error.problems]}
        body.update(json_safe(error.extra))
        return body
    if isinstance(error, PlannerError):
        code = next(c for cls, c in _PLANNER_CODES if isinstance(error, cls))
        body = {"error": code, "message": str(error),
                "problems": [_problem(p) for p in getattr(error, "problems", [])]}
        if isinstance(error, UnsupportedExport):
            body.update(format=error.format, reasons=list(error.reasons))
        return body
    if isinstance(error, OperationalError):
        return {"error": StorageUnavailable.code, "problems": [],
                "message": "the database cannot be reached; check HETPLAN_DATABASE_URL and "
                           "that the database server is up"}
    return {"error": "internal", "message": "internal error; see the server log", "problems": []}


def _validation_problems(error: RequestValidationError) -> list[Problem]:
    problems = []
    for item in error.errors():
        if item.get("type") == "json_invalid":  # its loc is a character offset, not a field
            reason = (item.get("ctx") or {}).get("error", "")
            problems.append(Problem(path="(body)", message=f"the body is not valid JSON: "
                                    f"{reason}; send a JSON document"))
            continue
        loc = [p for p in item.get("loc", ()) if p != "body"] or ["(body)"]
        path = ""
        for part in loc:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        value = item.get("input")
        if isinstance(value, dict | list) or item.get("type") == "missing":
            value = None
        problems.append(Problem(path=path, message=item.get("msg", "invalid"), value=value))
    return problems


def error_headers(error: Exception) -> dict[str, str]:
    """Headers an error answer carries: `WWW-Authenticate` on 401, `Retry-After` on every
    answer that may succeed later (all 503s, 409 conflicts)."""
    if isinstance(error, Unauthorized):
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(error, ApiError) and error.retry_after_s is not None:
        return {"Retry-After": str(error.retry_after_s)}
    if isinstance(error, OperationalError):
        return {"Retry-After": str(StorageUnavailable.retry_after_s)}
    return {}


def _with_a_problem(body: dict[str, Any], status: int, request: Request) -> dict[str, Any]:
    """A client error always lists at least one problem: without a field to blame, the
    request's path and what is wrong with it."""
    if status < 500 and not body["problems"]:
        body["problems"] = [{"path": request.url.path, "message": body["message"]}]
    return body


def error_response(request: Request, error: Exception) -> JSONResponse:
    """The answer to an `ApiError` or planner error raised while serving `request`."""
    status = error_status(error)
    return JSONResponse(_with_a_problem(error_body(error), status, request), status_code=status,
                        headers=error_headers(error))


async def _on_api_error(request: Request, error: Exception) -> JSONResponse:
    return error_response(request, error)


async def _on_validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    problems = _validation_problems(error)
    message = "the request is malformed: " + "; ".join(str(p) for p in problems[:5])
    body = {"error": "invalid_request", "message": message,
            "problems": [_problem(p) for p in problems]}
    return JSONResponse(body, status_code=422)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on this path: starlette's 405 names only those of
    the first route that matched the path (POST on /v1/plans, which also serves GET)."""
    methods: set[str] = set()
    for route in flat_routes(request.app.router.routes):
        if route.matches(request.scope)[0] is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))



async def _on_http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(
        error.status_code, "http_error")
    body = {"error": code, "message": str(error.detail), "problems": []}
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return JSONResponse(_with_a_problem(body, error.status_code, request),
                        status_code=error.status_code, headers=headers)


async def _on_storage_error(request: Request, error: Exception) -> JSONResponse:
    log.error("storage error on %s %s: %s", request.method, request.url.path, error)
    return JSONResponse(error_body(error), status_code=503, headers=error_headers(error))


async def _on_unexpected(request: Request, error: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=error)
    return JSONResponse(error_body(error), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Register the one mapping of errors to HTTP answers on `app`."""
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(PlannerError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(OperationalError, _on_storage_error)


def _documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    from api.schemas import ErrorPublic

    text = {401: "No or unknown bearer token.", 403: "The token lacks the scope.",
            404: "Not stored.",
            413: "Body above the server's limit.",
            422: "Malformed, out-of-range or unknown input; `problems` lists paths.",
            503: "Overloaded, or the database is unreachable; retry after `Retry-After` seconds.",
            400: "The body could not be read as JSON text at all.",
            409: "Not possible in the resource's current state (a job that has ended), or "
                 "concurrent uploads kept colliding (then retry after `Retry-After` seconds)."}
    return {s: {"model": ErrorPublic, "description": text[s]} for s in statuses}


class ErrorResponses:
    """Error answers to list in the OpenAPI document, per kind of route."""

    common = _documented(401, 403, 422, 503)
    write = _documented(400, 413)
    upload = _documented(400, 409, 413)
    not_found = _documented(404)
    conflict = _documented(409)
