"""Dependencies of the routes, as `Annotated` aliases (`StoreDep`, `UploadAuth`, ...).

They are `async def` because they only read `app.state`: FastAPI then calls them on the
event loop instead of sending each to the thread pool (a measurable cost per request).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from api.auth import Principal, require
from api.cache import LruCache
from api.jobs import JobQueue
from api.metrics import Metrics
from api.services.planning import Solver
from api.settings import Scope, Settings
from api.storage import Store

__all__ = [
    "StoreDep",
    "SettingsDep",
    "RunnerDep",
    "SolverDep",
    "MetricsDep",
    "PlanCacheDep",
    "ReadAuth",
    "UploadAuth",
    "PlanAuth",
    "IdempotencyKey",
]


async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_runner(request: Request) -> JobQueue:
    return request.app.state.runner


async def get_solver(request: Request) -> Solver:
    return request.app.state.solver


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_plan_cache(request: Request) -> LruCache:
    return request.app.state.plan_cache


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
RunnerDep = Annotated[JobQueue, Depends(get_runner)]
SolverDep = Annotated[Solver, Depends(get_solver)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
PlanCacheDep = Annotated[LruCache, Depends(get_plan_cache)]
ReadAuth = Annotated[Principal, Depends(require(None))]
UploadAuth = Annotated[Principal, Depends(require(Scope.UPLOAD))]
PlanAuth = Annotated[Principal, Depends(require(Scope.PLAN))]
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=200,
           description="Repeat an upload safely: the same key with the same body returns "
                       "the first answer and stores nothing new."),
]
