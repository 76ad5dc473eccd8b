"""A small client of the hetplan service, for job schedulers, profilers and the CLI.

    HetplanError                the base: catch this to handle every failure
    ├── ServerUnreachable       no answer after the retries (connection refused, timeout)
    ├── JobFailed               a plan job ended `failed` or `cancelled` (`.job`)
    └── ApiError                the server answered with an error status (`.status`,
        │                       `.code`, `.problems`, `.body`)
        ├── Unauthorized        401 / 403
        ├── NotFound            404
        ├── InvalidRequest      400 / 413 / 422: change the request (see `.problems`)
        └── ServerError         5xx, after the retries

Connection errors and 5xx answers are retried with exponential back-off for requests
that are safe to repeat: reads, and uploads (which always carry an Idempotency-Key, one
generated per call when not given). Plan requests are retried only when the connection
failed before anything was sent.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

__all__ = [
    "HetplanClient",
    "HetplanError",
    "ServerUnreachable",
    "JobFailed",
    "ApiError",
    "Unauthorized",
    "NotFound",
    "InvalidRequest",
    "ServerError",
]


class HetplanError(Exception):
    """Base of every error this client raises."""


class ServerUnreachable(HetplanError):
    pass


class JobFailed(HetplanError):
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        error = job.get("error") or {}
        super().__init__(f"plan job {job.get('id')} ended {job.get('status')}: "
                         f"{error.get('message', job.get('message', ''))}")


class ApiError(HetplanError):
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        data = body if isinstance(body, dict) else {}
        self.code: str = str(data.get("error", "http_error"))
        self.problems: list[dict[str, Any]] = list(data.get("problems") or [])
        message = data.get("message") if data else str(body)[:500]
        super().__init__(f"HTTP {status} {self.code}: {message}")


class Unauthorized(ApiError):
    pass


class NotFound(ApiError):
    pass


class InvalidRequest(ApiError):
    pass


class ServerError(ApiError):
    pass


def _error_for(status: int, body: Any) -> ApiError:
    if status in (401, 403):
        return Unauthorized(status, body)
    if status == 404:
        return NotFound(status, body)
    if status >= 500:
        return ServerError(status, body)
    if status in (400, 409, 413, 422):
        return InvalidRequest(status, body)
    return ApiError(status, body)


class HetplanClient:
    """Talks to one hetplan server. Use as a context manager, or call `close()`."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 60, *,
                 retries: int = 3, backoff_s: float = 0.2,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                  timeout=timeout_s, transport=transport)

    def __enter__(self) -> HetplanClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- resources ---------------------------------------------------------------------

    def create_plan(self, scenario: dict[str, Any], *, time_limit_s: float | None = None,
                    wait: bool = True, poll_s: float = 0.5) -> dict[str, Any]:
        """Plan a whole scenario document. Returns the plan answer (`id`, `plan`,
        `evaluation`, ...); with `wait=False` a long search returns its job instead."""
        return self.request_plan({"scenario": scenario}, time_limit_s=time_limit_s,
                                 wait=wait, poll_s=poll_s)

    def request_plan(self, request: dict[str, Any], *, time_limit_s: float | None = None,
                     wait: bool = True, poll_s: float = 0.5) -> dict[str, Any]:
        """Plan from any plan request body (stored cluster and model names, pins, ...)."""
        body = dict(request)
        if time_limit_s is not None:
            body["options"] = {**body.get("options", {}), "time_limit_s": time_limit_s}
        response = self._send("POST", "/v1/plans", json=body, retry_on_answer=False)
        answer = response.json()
        if response.status_code != 202 or not wait:
            return answer
        job = self.wait_for_job(answer["id"], poll_s=poll_s)
        return self.get_plan(job["plan_id"])

    def wait_for_job(self, job_id: str, *, poll_s: float = 0.5,
                     timeout_s: float | None = None) -> dict[str, Any]:
        """Poll a plan job until it ends; `JobFailed` unless it succeeded."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if job["status"] == "succeeded":
                return job
            if job["status"] in ("failed", "cancelled"):
                raise JobFailed(job)
            if deadline is not None and time.monotonic() > deadline:
                raise HetplanError(f"plan job {job_id} still {job['status']} after "
                                   f"{timeout_s} s; cancel it with cancel_job()")
            time.sleep(poll_s)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._get(f"/v1/jobs/{job_id}")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._send("POST", f"/v1/jobs/{job_id}/cancel").json()

    def get_plan(self, plan_id: str) -> dict[str, Any]:
        return self._get(f"/v1/plans/{plan_id}")

    def get_plan_scenario(self, plan_id: str) -> dict[str, Any]:
        """The scenario document a stored plan was computed for."""
        return self._get(f"/v1/plans/{plan_id}/scenario")

    def evaluate(self, scenario: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
        """The cost model's numbers (docs/formats.md) for `plan` on `scenario` (`valid`, `errors`, ...)."""
        return self._send("POST", "/v1/evaluate",
                          json={"scenario": scenario, "plan": plan}).json()

    def upload_profiles(self, model: str, gpu_type: str, rows: list[dict[str, Any]], *,
                        source: dict[str, Any] | None = None,
                        idempotency_key: str | None = None) -> dict[str, Any]:
        """Store profile rows as a new version for (model, GPU type); safe to retry."""
        body: dict[str, Any] = {"model": model, "gpu_type": gpu_type, "rows": rows}
        if source is not None:
            body["source"] = source
        return self._upload("/v1/profiles", body, idempotency_key)

    def upload_links(self, links: list[dict[str, Any]], *,
                     idempotency_key: str | None = None) -> dict[str, Any]:
        """Store measured links as a new version of the link catalogue; safe to retry."""
        return self._upload("/v1/links", {"links": links}, idempotency_key)

    def register_gpu_type(self, name: str, **fields: Any) -> dict[str, Any]:
        return self._send("POST", "/v1/gpu-types", json={"name": name, **fields}).json()

    def register_model(self, model: dict[str, Any]) -> dict[str, Any]:
        return self._send("POST", "/v1/models", json=model).json()

    def register_cluster(self, cluster: dict[str, Any]) -> dict[str, Any]:
        return self._send("POST", "/v1/clusters", json=cluster).json()

    def export_plan(self, plan_id: str, fmt: str) -> dict[str, Any]:
        return self._get(f"/v1/plans/{plan_id}/export", params={"format": fmt})

    def rank_map(self, plan_id: str) -> dict[str, Any]:
        return self._get(f"/v1/plans/{plan_id}/rankmap")

    # -- transport -----------------------------------------------------------------------

    def _get(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._send("GET", path, **kwargs).json()

    def _upload(self, path: str, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        headers = {"Idempotency-Key": key or uuid.uuid4().hex}
        return self._send("POST", path, json=body, headers=headers).json()

    def _send(self, method: str, path: str, *, retry_on_answer: bool | None = None,
              **kwargs: Any) -> httpx.Response:
        """Send with retries; `retry_on_answer` (default: GETs and idempotent uploads)
        says whether a 5xx answer or a lost answer may be retried."""
        if retry_on_answer is None:
            retry_on_answer = method == "GET" or "Idempotency-Key" in kwargs.get("headers", {})
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.ConnectError as error:  # nothing was sent: always safe to retry
                if attempt >= self.retries:
                    raise ServerUnreachable(f"cannot connect to {self._http.base_url}: "
                                            f"{error}") from error
            except httpx.TransportError as error:
                if not retry_on_answer or attempt >= self.retries:
                    raise ServerUnreachable(f"{method} {path} failed: {error}") from error
            else:
                if response.status_code < 400:
                    return response
                if not (response.status_code >= 500 and retry_on_answer
                        and attempt < self.retries):
                    raise _error_for(response.status_code, _body(response))
            time.sleep(self.backoff_s * 2**attempt)
            attempt += 1


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
