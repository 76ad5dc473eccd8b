"""Prometheus metrics of one app, in its own registry (so several apps, e.g. in tests,
never share counters), and the ASGI middleware that counts requests and times them."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["Metrics", "MetricsMiddleware"]

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods counted under their own name; any other (a client may send any token) counts
as `other`, so no request can add a time series."""
_UNMATCHED = "unmatched"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_SOLVE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("hetplan_http_requests_total", "HTTP requests answered.",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("hetplan_http_request_duration_seconds",
                                 "Time to answer an HTTP request.", ["method", "route"],
                                 buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.solves = Histogram("hetplan_solve_seconds", "Wall time of plan searches.",
                                ["outcome"], buckets=_SOLVE_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("hetplan_jobs_pending",
                                 "Jobs running in this process's worker.",
                                 registry=self.registry)
        self._request_series: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def observe_request(self, method: str, route: str, status: str, seconds: float) -> None:
        """Count and time one answered request. Each label set's series are looked up
        once and kept (`labels()` costs more than the count itself on a cached read);
        the label values are a fixed set, so this stays small."""
        key = (method, route, status)
        series = self._request_series.get(key)
        if series is None:
            series = (self.requests.labels(method=method, route=route, status=status),
                      self.latency.labels(method=method, route=route))
            self._request_series[key] = series
        count, latency = series
        count.inc()
        latency.observe(seconds)

    def observe_solve(self, outcome: str, seconds: float) -> None:
        self.solves.labels(outcome=outcome).observe(seconds)


class MetricsMiddleware:
    """Counts and times every HTTP request by route template (not raw path, which would
    make one time series per plan id); paths no route matches count as `unmatched`, and
    methods outside `_METHODS` as `other`, so the label values are a fixed set."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            # path_format: the template without convertors (`{plan_id}`, not `{plan_id:hexid}`)
            route = getattr(scope.get("route"), "path_format", _UNMATCHED)
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.observe_request(method, route, str(status),
                                         time.perf_counter() - started)
