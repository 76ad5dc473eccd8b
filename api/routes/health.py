"""Liveness, readiness and metrics: outside /v1, for probes and scrapers."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import MetricsDep, StoreDep

router = APIRouter(tags=["health"])

PROBE_TIMEOUT_S = 1.5
"""Below the probes' own timeouts (Docker 2 s, Kubernetes 3 s): a slow database is
answered 503, not left to time out the probe."""


@router.get("/healthz", operation_id="healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", summary="The database answers",
            responses={503: {"description": "The database cannot be reached."}})
async def readyz(request: Request, store: StoreDep) -> Any:
    # the ping runs on a thread of its own, never the pool that runs solves and other
    # requests, so a busy server still answers its readiness probe at once
    pool = request.app.state.probe_pool
    try:
        await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(pool, store.ping),
                               PROBE_TIMEOUT_S)
    except Exception as error:  # any failure means "not ready", never a 500
        return JSONResponse({"status": "unavailable", "database": type(error).__name__},
                            status_code=503, headers={"Retry-After": "5"})
    return {"status": "ok", "database": store.engine.dialect.name}


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics",
            response_class=Response)
def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
