"""The plan viewer's pages: HTML for people, outside the versioned JSON API (and outside
the OpenAPI document). plotly.js comes from this server, never from the internet."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Path, Query
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from api.deps import ReadAuth, StoreDep
from api.schemas import NAME_PATTERN
from api.storage import Store
from api.storage.store import PlanRecord
from api.viewer import PLOTLY_FILE, PlanView, compare_page, plan_page, plotly_js_dir
from planner import parse_plan, parse_scenario

__all__ = ["install_plan_viewer"]

PLOTLY_URL = "/static/plotly"
PlanId = Annotated[str, Path(min_length=1, max_length=200, pattern=NAME_PATTERN)]
PlanQuery = Annotated[str, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)]

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


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
async def plan(plan_id: PlanId, store: StoreDep, _: ReadAuth) -> HTMLResponse:
    """One stored plan drawn: timelines, memory, idle GPUs, baselines, cost."""
    return HTMLResponse(await run_in_threadpool(_plan_page, store, plan_id))


@router.get("/compare", response_class=HTMLResponse)
async def compare(a: PlanQuery, b: PlanQuery, store: StoreDep, _: ReadAuth) -> HTMLResponse:
    """Two stored plans side by side."""
    return HTMLResponse(await run_in_threadpool(_compare_page, store, a, b))


def install_plan_viewer(app: FastAPI) -> None:
    """Serve /ui/... and the plotly.js the plotly package ships."""
    app.include_router(router)
    app.mount(PLOTLY_URL, StaticFiles(directory=plotly_js_dir()), name="plotly")
