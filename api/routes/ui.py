"""The plan viewer's pages: HTML for people, outside the versioned JSON API (and outside
the OpenAPI document). plotly.js comes from this server, never from the internet."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Path, Query
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from api.deps import ReadAuth, StoreDep
from api.errors import InvalidRequest
from api.route_table import add_routes
from api.schemas import NAME_PATTERN
from api.storage import Store
from api.storage.store import PlanRecord
from api.viewer import (
    PLOTLY_FILE,
    PlanView,
    chart_point,
    compare_page,
    frontier_page,
    plan_page,
    plotly_js_dir,
)
from planner import parse_plan, parse_scenario
from planner.errors import Problem

__all__ = ["install_plan_viewer"]

PLOTLY_URL = "/static/plotly"
PlanId = Annotated[str, Path(min_length=1, max_length=200, pattern=NAME_PATTERN)]
PlanQuery = Annotated[str, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)]
MAX_CHART_PLANS = 64
PlanList = Annotated[str, Query(min_length=1, max_length=MAX_CHART_PLANS * 201,
                                pattern=NAME_PATTERN)]

router = APIRouter(prefix="/ui", include_in_schema=False)


def _view(record: PlanRecord) -> PlanView:
    search = record.document.get("search") or {}
    return PlanView(title=f"plan {record.id}", scenario=parse_scenario(record.scenario),
                    plan=parse_plan(record.document), status=record.status,
                    baselines_samples_per_s=search.get("baselines_samples_per_s") or {},
                    unused_gpus=record.unused_gpus)


def _plan_page(store: Store, plan_id: str) -> str:
    view = _view(store.get_plan(plan_id, with_scenario=True))
    return plan_page(view, plotly_src=f"{PLOTLY_URL}/{PLOTLY_FILE}")


def _compare_page(store: Store, a: str, b: str) -> str:
    first, second = (_view(store.get_plan(plan_id, with_scenario=True)) for plan_id in (a, b))
    return compare_page(first, second, plotly_src=f"{PLOTLY_URL}/{PLOTLY_FILE}")


def _plan_ids(plans: str) -> list[str]:
    """Comma-separated ids, each once, in order; at most MAX_CHART_PLANS."""
    ids = list(dict.fromkeys(i.strip() for i in plans.split(",") if i.strip()))
    if not ids or len(ids) > MAX_CHART_PLANS:
        raise InvalidRequest(
            f"plans names {len(ids)} plan ids; give 1 to {MAX_CHART_PLANS}, comma-separated "
            "(the plan_id of each point POST /v1/plans/pareto answered)",
            problems=[Problem(path="plans", message=f"{len(ids)} ids")])
    return ids


def _frontier_page(store: Store, ids: list[str]) -> str:
    points = [chart_point(_view(store.get_plan(plan_id, with_scenario=True)),
                          f"plans/{quote(plan_id, safe='')}") for plan_id in ids]
    return frontier_page(f"samples/s against USD/hour: {len(points)} plans", points,
                         plotly_src=f"{PLOTLY_URL}/{PLOTLY_FILE}")


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
async def plan(plan_id: PlanId, store: StoreDep, _: ReadAuth) -> HTMLResponse:
    """One stored plan drawn: timelines, memory, idle GPUs, baselines, cost."""
    return HTMLResponse(await run_in_threadpool(_plan_page, store, plan_id))


@router.get("/compare", response_class=HTMLResponse)
async def compare(a: PlanQuery, b: PlanQuery, store: StoreDep, _: ReadAuth) -> HTMLResponse:
    """Two stored plans side by side."""
    return HTMLResponse(await run_in_threadpool(_compare_page, store, a, b))


@router.get("/frontier", response_class=HTMLResponse)
async def frontier(plans: PlanList, store: StoreDep, _: ReadAuth) -> HTMLResponse:
    """Stored plans on a cost/throughput chart, the frontier joined, each point a link to
    its plan's page: `?plans=id1,id2,...` (a frontier's plan ids)."""
    ids = _plan_ids(plans)
    return HTMLResponse(await run_in_threadpool(_frontier_page, store, ids))


def install_plan_viewer(app: FastAPI) -> None:
    """Serve /ui/... and the plotly.js the plotly package ships."""
    add_routes(app, router)
    app.mount(PLOTLY_URL, StaticFiles(directory=plotly_js_dir()), name="plotly")
