"""Plans: request one (inline answer or a job), read stored ones, export them; evaluate."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

import planner
from api import schemas
from api.admission import InlineSolves
from api.cache import LruCache
from api.deps import (
    MetricsDep,
    PlanAuth,
    PlanCacheDep,
    ReadAuth,
    RunnerDep,
    SettingsDep,
    SolverDep,
    StoreDep,
)
from api.errors import ErrorResponses, ExportUnavailable, InvalidRequest
from api.examples import openapi_examples
from api.job_requests import job_request
from api.jobs import JobQueue
from api.routing import CheckedRoute
from api.services import planning
from api.services.scenarios import Assembled, assemble
from api.storage import JobKind, PlanRecord, Store

router = APIRouter(prefix="/v1/plans", tags=["plans"], responses=ErrorResponses.common,
                   route_class=CheckedRoute)
evaluate_router = APIRouter(prefix="/v1/evaluate", tags=["plans"],
                            responses=ErrorResponses.common, route_class=CheckedRoute)

PlanId = Annotated[str, Path(min_length=1, max_length=200, pattern=schemas.NAME_PATTERN,
                              description="Hexadecimal; any other id is simply not stored (404).")]


class _HexId(Convertor[str]):
    """Plan ids in paths: hex only, so that `/v1/plans/pareto` is not read as a plan id."""

    regex = "[0-9a-f]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("hexid", _HexId())


@router.post(
    "", status_code=201, response_model=schemas.PlanPublic, operation_id="create_plan",
    summary="Plan a scenario: the plan (201) or, for a long search, a job to poll (202)",
    responses={**ErrorResponses.write, 202: {"model": schemas.JobPublic,
                                             "description": "A job; poll GET /v1/jobs/{id}."}},
)
async def create(body: Annotated[schemas.PlanRequest, Body(openapi_examples=openapi_examples(
                     "/v1/plans"))], request: Request, store: StoreDep,
                 settings: SettingsDep, solver: SolverDep, runner: RunnerDep,
                 metrics: MetricsDep, _: PlanAuth, response: Response,
                 job: Annotated[bool, Query(description="Always answer with a job.")] = False,
                 ) -> Any:
    """Searches whose time limit is at most the server's `sync_solve_threshold_s` are
    answered inline; longer ones (or `?job=true`) become a job. A goal in money
    (`objective` cost, a budget or a floor) plans sub-fleets in turn: its time limit
    counts once per sub-fleet. A scenario so large that the steps no time limit governs
    would alone take longer than that threshold is a job too (see `time_limit_s`). Time
    limits above the server's `max_time_limit_s` are capped (`options.time_limit_s` in the
    answer).
    Beyond `max_inline_solves` running inline searches the answer is 503 with
    `Retry-After`; beyond `max_plan_layers` or `max_plan_gpus`, 422 `scenario_too_large`."""
    options = planning.plan_options(body.options, settings)

    @functools.cache
    def assembled() -> Assembled:
        found = assemble(body, store)
        planning.check_size(found.scenario, settings)
        return found

    runs = 1
    if planning.has_goal(options):  # its sub-fleets are counted on the scenario
        runs = await run_in_threadpool(lambda: planning.search_runs(assembled().scenario, options))
    if job or not planning.answers_inline(options.time_limit_s * runs, settings):
        return await run_in_threadpool(lambda: _job_answer(runner, assembled(), options))
    inline: InlineSolves = request.app.state.inline_solves

    def solved_or_queued() -> PlanRecord | JSONResponse:
        """The plan, or a job where the scenario's untimed steps alone are too long to wait
        for (known only once it is assembled: a full server refuses before that)."""
        found = assembled()
        if planning.untimed_past_threshold(found.scenario, runs, settings):
            return _job_answer(runner, found, options)
        return planning.solve_and_store(found, options, solver=solver, store=store,
                                        observe=metrics.observe_solve)

    plan = await inline.run(solved_or_queued)
    if isinstance(plan, JSONResponse):
        return plan
    response.headers["Location"] = f"/v1/plans/{plan.id}"
    return planning.plan_public(plan)


def _job_answer(runner: JobQueue, found: Assembled, options: planner.SearchOptions
                ) -> JSONResponse:
    """202 with the job that will search `found`."""
    record = runner.submit(JobKind.PLAN, job_request(found, options))
    public = schemas.JobPublic.model_validate(record, from_attributes=True)
    return JSONResponse(public.model_dump(mode="json"), status_code=202,
                        headers={"Location": f"/v1/jobs/{record.id}"})


@router.get("", response_model=schemas.Page[schemas.PlanSummary], operation_id="list_plans",
            summary="Stored plans, newest first")
def list_plans(store: StoreDep, _: ReadAuth,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> dict[str, Any]:
    records, count = store.list_plans(limit=limit, offset=offset)
    return {"data": [planning.plan_summary(r) for r in records], "count": count}


@router.get("/{plan_id:hexid}", response_model=schemas.PlanPublic, operation_id="get_plan",
            responses=ErrorResponses.not_found, summary="A stored plan")
async def get(plan_id: PlanId, store: StoreDep, cache: PlanCacheDep, _: ReadAuth) -> Response:
    """Stored plans never change, so their encoded answer is cached per process; a cached
    plan is answered on the event loop, a miss reads the database on the thread pool."""
    encoded = cache.get(plan_id)
    if encoded is None:
        encoded = await run_in_threadpool(_encoded_plan, store, cache, plan_id)
    return Response(encoded, media_type="application/json")


@router.get("/{plan_id}/scenario", operation_id="get_plan_scenario",
            responses=ErrorResponses.not_found,
            summary="The scenario document the plan was computed for")
def scenario(plan_id: PlanId, store: StoreDep, _: ReadAuth) -> dict[str, Any]:
    return store.get_plan(plan_id, with_scenario=True).scenario


@router.get("/{plan_id}/rankmap", operation_id="get_plan_rankmap",
            responses={**ErrorResponses.not_found, 501: {"model": schemas.ErrorPublic}},
            summary="Global rank of every GPU of the plan, per stage and replica")
def rankmap(plan_id: PlanId, store: StoreDep, _: ReadAuth) -> dict[str, Any]:
    export = _export_module()
    import planner

    return export.rank_map(planner.parse_plan(store.get_plan(plan_id).document))


@router.get("/{plan_id}/export", operation_id="export_plan",
            responses={**ErrorResponses.not_found, 501: {"model": schemas.ErrorPublic}},
            summary="The plan as a launcher configuration")
def export(plan_id: PlanId, store: StoreDep, _: ReadAuth,
           query: Annotated[schemas.ExportQuery, Query()]) -> dict[str, Any]:
    """The options of `hetplan export`, as query parameters (repeat `script_arg` and
    `gpu_name`); the plan's stored scenario gives the layer kinds, the job's schedule and
    ZeRO stage, as `--scenario` does. 422 `unsupported_export` with `reasons` when the
    launcher cannot express the plan, 422 `invalid_request` for an option the format does
    not take."""
    module = _export_module()
    import planner

    record = store.get_plan(plan_id, with_scenario=True)
    plan = planner.parse_plan(record.document)
    scenario = None if record.scenario is None else planner.parse_scenario(record.scenario)
    try:
        return module.export_with_scenario(plan, query.format.value, scenario, query.options())
    except ValueError as error:
        raise InvalidRequest(str(error)) from None


@evaluate_router.post("", response_model=schemas.EvaluationPublic, operation_id="evaluate_plan",
                      responses=ErrorResponses.write,
                      summary="The cost model's numbers for a plan (valid or not)")
def evaluate(body: schemas.EvaluateRequest, store: StoreDep, settings: SettingsDep,
             _: PlanAuth) -> dict[str, Any]:
    """An invalid plan is an answer (`valid: false`, `errors`), not an error status."""
    assembled = assemble(body, store)
    planning.check_size(assembled.scenario, settings)
    return planning.evaluate(assembled, body.plan)


def _encoded_plan(store: Store, cache: LruCache, plan_id: str) -> bytes:
    public = schemas.PlanPublic.model_validate(planning.plan_public(store.get_plan(plan_id)))
    encoded = public.model_dump_json().encode()
    cache.put(plan_id, encoded)
    return encoded


def _export_module() -> Any:
    try:
        from planner import export as module
    except ImportError as error:
        raise ExportUnavailable(f"plan export is not available in this installation ({error}); "
                                "upgrade hetplan to a version with planner.export") from None
    return module
