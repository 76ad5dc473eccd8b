"""The app factory: `create_app(settings)` wires settings, storage, solver, jobs, auth,
metrics and routes. Nothing is global, so tests build as many apps as they like."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.routing import APIRoute

import planner
from api.admission import InlineSolves, RefuseWhenFull
from api.auth import openapi_as_configured
from api.cache import LruCache
from api.cached_reads import CachedPlanReads
from api.errors import install_error_handlers
from api.jobs import JobQueue, Worker
from api.limits import BodyLimitMiddleware
from api.metrics import Metrics, MetricsMiddleware
from api.route_table import add_routes, flat_routes
from api.routes import ROUTERS, health
from api.routes.docs import install_offline_docs
from api.routes.ui import install_plan_viewer
from api.services.planning import Solver
from api.settings import Settings
from api.solving import ProcessSolver, start_search_server
from api.storage import Store, make_engine, migrate

__all__ = ["create_app", "create_app_from_env", "API_VERSION"]

API_VERSION = version("hetplan")
"""The OpenAPI document's version: the package's, so a client can tell what it talks to."""

log = logging.getLogger("hetplan.api")

DESCRIPTION = """\
Plans for training large models on heterogeneous GPU clusters.

Profilers upload measurements (`/v1/profiles`, `/v1/links`); operators register GPU types,
models and clusters; schedulers ask for plans (`POST /v1/plans`) and poll jobs for long
searches. Documents follow docs/formats.md (`hetplan-scenario/1`, `hetplan-plan/1`; JSON
Schemas at `/v1/schemas/scenario` and `/v1/schemas/plan`).
Every error answers `{"error", "message", "problems"}` with what to change.
"""


def _in_process_solver(scenario: planner.Scenario, options: planner.SearchOptions,
                       progress: Any) -> planner.PlanResult:
    return planner.plan(scenario, options, progress=progress)


def create_app(settings: Settings | None = None, *, solver: Solver | None = None,
               engine: sa.Engine | None = None) -> FastAPI:
    """The hetplan service. `solver` replaces `planner.plan` (tests); `engine` replaces
    the one built from `settings.database_url`."""
    settings = settings or Settings()
    engine = engine or make_engine(settings.database_url)
    solver = solver or (ProcessSolver(max_memory_bytes=settings.max_search_memory_bytes,
                                      max_idle=max(4, settings.solver_workers),
                                      niceness=settings.search_niceness)
                        if settings.solve_in_processes else _in_process_solver)
    store = Store(engine, cache_bytes=settings.catalogue_cache_bytes)
    metrics = Metrics()
    worker = Worker(store=store, solver=solver, metrics=metrics,
                    concurrency=settings.solver_workers, lease_s=settings.job_lease_s,
                    poll_s=settings.job_poll_s, max_attempts=settings.max_job_attempts
                    ) if settings.embedded_worker else None
    runner = JobQueue(store=store, max_pending=settings.max_pending_jobs,
                      on_submit=None if worker is None else worker.wake)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_startup:
            migrate(engine)
        if isinstance(solver, ProcessSolver):
            start_search_server()
        if worker is not None:
            worker.start()
        app.state.probe_pool = ThreadPoolExecutor(1, thread_name_prefix="hetplan-probe")
        try:
            yield
        finally:
            if worker is not None:
                worker.stop()
            if isinstance(solver, ProcessSolver):
                solver.close()
            app.state.probe_pool.shutdown(wait=False, cancel_futures=True)
            engine.dispose()

    app = FastAPI(title="hetplan", version=API_VERSION, description=DESCRIPTION,
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.store = store
    app.state.metrics = metrics
    app.state.runner = runner
    app.state.worker = worker
    app.state.solver = solver
    app.state.plan_cache = LruCache(settings.plan_cache_bytes)
    app.state.inline_solves = InlineSolves(settings.max_inline_solves)
    app.openapi = openapi_as_configured(app, settings)  # type: ignore[method-assign]
    install_error_handlers(app)
    install_offline_docs(app)
    install_plan_viewer(app)
    for router in (health.router, *ROUTERS):
        add_routes(app, router)
    app.add_middleware(RefuseWhenFull, solves=app.state.inline_solves, settings=settings,
                       route=_route(app, "create_plan"))
    app.add_middleware(CachedPlanReads, cache=app.state.plan_cache, settings=settings,
                       route=_route(app, "get_plan"))
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _route(app: FastAPI, operation_id: str) -> APIRoute:
    return next(route for route in flat_routes(app.router.routes)
                if isinstance(route, APIRoute) and route.operation_id == operation_id)


def create_app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` and multi-worker serving: settings from HETPLAN_*."""
    return create_app(Settings())
