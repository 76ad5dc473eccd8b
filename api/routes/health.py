"""Liveness, readiness and metrics: outside /v1, for probes and scrapers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import MetricsDep, StoreDep

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", summary="The database answers",
            responses={503: {"description": "The database cannot be reached."}})
def readyz(store: StoreDep) -> Any:
    try:
        store.ping()
    except Exception as error:  # any failure means "not ready", never a 500
        return JSONResponse({"status": "unavailable", "database": type(error).__name__},
                            status_code=503)
    return {"status": "ok", "database": store.engine.dialect.name}


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics",
            response_class=Response)
def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
