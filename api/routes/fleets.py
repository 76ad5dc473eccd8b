"""Money questions: the cost/throughput frontier and what-if fleets, answered inline."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api import fleet_schemas
from api.deps import PlanAuth, SettingsDep, SolverDep, StoreDep
from api.errors import ErrorResponses
from api.routing import CheckedRoute
from api.services import fleets
from api.services.planning import check_size, effective_options
from api.services.scenarios import assemble

pareto_router = APIRouter(prefix="/v1/plans", tags=["plans"], responses=ErrorResponses.common,
                          route_class=CheckedRoute)
whatif_router = APIRouter(prefix="/v1/whatif", tags=["plans"], responses=ErrorResponses.common,
                          route_class=CheckedRoute)


@pareto_router.post(
    "/pareto", status_code=201, response_model=fleet_schemas.FrontierPublic,
    operation_id="create_frontier", responses=ErrorResponses.write,
    summary="The cost/throughput Pareto frontier over sub-fleets, each point a stored plan")
def pareto(body: fleet_schemas.ParetoRequest, store: StoreDep, settings: SettingsDep,
           solver: SolverDep, _: PlanAuth) -> Any:
    """Plans every subset of the GPU types and partial fleets (`options.max_fleets`) and
    keeps the plans no other is both faster and cheaper than. Every GPU type in the
    cluster needs an `hourly_usd`."""
    assembled = assemble(body, store)
    check_size(assembled.scenario, settings)
    options = effective_options(body.options.time_limit_s, False, settings)
    fleets.check_sweep_budget(body.options.max_fleets, options.time_limit_s, settings)
    return fleets.frontier_and_store(assembled, options, body.options.max_fleets,
                                     solver=solver, store=store)


@whatif_router.post(
    "", status_code=201, response_model=fleet_schemas.WhatIfPublic, operation_id="what_if",
    responses=ErrorResponses.write,
    summary="Plan changed fleets and compare throughput and price with the base fleet")
def what_if(body: fleet_schemas.WhatIfRequest, store: StoreDep, settings: SettingsDep,
            solver: SolverDep, _: PlanAuth) -> Any:
    """The base fleet, then every variant (nodes added or removed per type, types taken
    out, links changed), each plan stored with the variant's scenario."""
    assembled = assemble(body, store)
    check_size(assembled.scenario, settings)
    options = effective_options(body.options.time_limit_s, False, settings)
    fleets.check_sweep_budget(len(body.variants) + 1, options.time_limit_s, settings)
    return fleets.what_if_and_store(assembled, list(body.variants), options,
                                    solver=solver, store=store)
