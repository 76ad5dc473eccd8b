"""The frontier and what-if fleets over HTTP: plan the fleets in turn, store every plan.

Every plan is stored like any other (`GET /v1/plans/{id}`): a frontier point with the
requested scenario (a sub-fleet's plan is a plan of the whole fleet with GPUs idle), a
what-if variant with the variant's own scenario, whose `sources` name the change.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import planner
from api.errors import InvalidRequest, json_safe
from api.services.planning import Solver, fleet_solve, store_result
from api.services.scenarios import Assembled
from api.settings import Settings
from api.storage import Store
from planner import fleet
from planner.documents import dump_document

__all__ = ["check_sweep_budget", "frontier_and_store", "what_if_and_store"]


def check_sweep_budget(num_plans: int, time_limit_s: float, settings: Settings) -> None:
    """Sweeps are answered inline: their total search time must fit the server's
    `max_time_limit_s`."""
    total = num_plans * time_limit_s
    if total > settings.max_time_limit_s:
        raise InvalidRequest(
            f"{num_plans} plans of {time_limit_s:g} s each need up to {total:g} s, above this "
            f"server's max_time_limit_s ({settings.max_time_limit_s:g} s); plan fewer fleets "
            "or lower options.time_limit_s")


def frontier_and_store(assembled: Assembled, options: planner.SearchOptions, max_fleets: int,
                       *, solver: Solver, store: Store) -> dict[str, Any]:
    """The cost/throughput frontier of the assembled scenario, each point stored."""
    started = time.monotonic()
    fleet.check_prices(assembled.scenario)
    fleets = fleet.sub_fleets(assembled.scenario, max_fleets)
    points = fleet.frontier(fleet.plan_fleets(fleets, options, solve=fleet_solve(solver)))
    answer = []
    for point in points:
        assert point.result is not None, "frontier points are planned"
        whole = fleet.on_whole_scenario(assembled.scenario, point, point.result.wall_s,
                                        {"fleet": point.label})
        record = store_result(assembled, options, whole, store=store)
        answer.append({"samples_per_s": point.samples_per_s, "usd_per_hour": point.usd_per_hour,
                       "usd_per_million_tokens": whole.evaluation.usd_per_million_tokens,
                       "fleet": point.label, "plan_id": record.id, "plan": record.document})
    return {"frontier": answer, "fleets_planned": len(fleets),
            "wall_s": time.monotonic() - started}


def what_if_and_store(assembled: Assembled, variants: list[fleet.FleetVariant],
                      options: planner.SearchOptions, *, solver: Solver,
                      store: Store) -> dict[str, Any]:
    """The base fleet and every variant planned, with changes against the base; each
    variant's plan stored with the variant's scenario."""
    rows = fleet.what_if(assembled.scenario, variants, options, solve=fleet_solve(solver))
    changed = [None, *variants]
    answer = []
    for row, variant in zip(rows, changed, strict=True):
        shown = row.numbers()
        result = row.outcome.result
        if result is not None:
            shown["plan_id"] = store_result(_variant(assembled, variant), options, result,
                                            store=store).id
        answer.append(shown)
    return {"rows": json_safe(answer)}


def _variant(assembled: Assembled, variant: fleet.FleetVariant | None) -> Assembled:
    if variant is None:
        return assembled
    scenario = fleet.apply_variant(assembled.scenario, variant)
    return replace(assembled, scenario=scenario, document=json_safe(dump_document(scenario)),
                   sources={**assembled.sources,
                            "whatif": variant.model_dump(mode="json", exclude_defaults=True)})
