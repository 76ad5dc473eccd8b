"""Money questions: the cost/throughput frontier and what-if fleets; inline when their
searches fit the server's `max_time_limit_s`, else (or with `?job=true`) a job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from api import fleet_schemas, schemas
from api.deps import PlanAuth, RunnerDep, SettingsDep, SolverDep, StoreDep
from api.errors import ErrorResponses
from api.job_requests import job_request
from api.jobs import JobQueue
from api.routing import CheckedRoute
from api.services import fleets
from api.services.planning import check_size, effective_options
from api.services.scenarios import assemble
from api.storage import JobKind

pareto_router = APIRouter(prefix="/v1/plans", tags=["plans"], responses=ErrorResponses.common,
                          route_class=CheckedRoute)
whatif_router = APIRouter(prefix="/v1/whatif", tags=["plans"], responses=ErrorResponses.common,
                          route_class=CheckedRoute)

_JOB_ANSWER: dict[int | str, dict[str, Any]] = {202: {"model": schemas.JobPublic,
                     "description": "A job; poll GET /v1/jobs/{id}: its `result` is this "
                                    "request's 201 answer."}}
JobQuery = Annotated[bool, Query(description="Always answer with a job.")]


@pareto_router.post(
    "/pareto", status_code=201, response_model=fleet_schemas.FrontierPublic,
    operation_id="create_frontier", responses={**ErrorResponses.write, **_JOB_ANSWER},
    summary="The cost/throughput Pareto frontier over sub-fleets, each point a stored plan")
def pareto(body: fleet_schemas.ParetoRequest, store: StoreDep, settings: SettingsDep,
           solver: SolverDep, runner: RunnerDep, _: PlanAuth, job: JobQuery = False) -> Any:
    """Plans every subset of the GPU types and partial fleets (`options.max_fleets`) and
    keeps the plans no other is both faster and cheaper than. Every GPU type in the
    cluster needs an `hourly_usd`. When `max_fleets` x `time_limit_s` is above the
    server's `max_time_limit_s` (or with `?job=true`) the answer is a job (202)."""
    assembled = assemble(body, store)
    check_size(assembled.scenario, settings)
    options = effective_options(body.options.time_limit_s, False, settings)
    if job or fleets.sweep_s(body.options.max_fleets, options) > settings.max_time_limit_s:
        fleets.check_prices(assembled.scenario)
        return _job_answer(runner, JobKind.PARETO, job_request(
            assembled, options, max_fleets=body.options.max_fleets))
    return fleets.frontier_and_store(assembled, options, body.options.max_fleets,
                                     solver=solver, store=store)


@whatif_router.post(
    "", status_code=201, response_model=fleet_schemas.WhatIfPublic, operation_id="what_if",
    responses={**ErrorResponses.write, **_JOB_ANSWER},
    summary="Plan changed fleets and compare throughput and price with the base fleet")
def what_if(body: fleet_schemas.WhatIfRequest, store: StoreDep, settings: SettingsDep,
            solver: SolverDep, runner: RunnerDep, _: PlanAuth, job: JobQuery = False) -> Any:
    """The base fleet, then every variant (nodes added or removed per type, types taken
    out, links changed), each plan stored with the variant's scenario. When (variants +
    1) x `time_limit_s` is above the server's `max_time_limit_s` (or with `?job=true`)
    the answer is a job (202)."""
    assembled = assemble(body, store)
    check_size(assembled.scenario, settings)
    options = effective_options(body.options.time_limit_s, False, settings)
    variants = list(body.variants)
    if job or fleets.sweep_s(len(variants) + 1, options) > settings.max_time_limit_s:
        fleets.check_variants(assembled.scenario, variants)
        return _job_answer(runner, JobKind.WHATIF, job_request(
            assembled, options, variants=variants))
    return fleets.what_if_and_store(assembled, variants, options, solver=solver, store=store)


def _job_answer(runner: JobQueue, kind: JobKind, request: dict[str, Any]) -> JSONResponse:
    record = runner.submit(kind, request)
    public = schemas.JobPublic.model_validate(record, from_attributes=True)
    return JSONResponse(public.model_dump(mode="json"), status_code=202,
                        headers={"Location": f"/v1/jobs/{record.id}"})
