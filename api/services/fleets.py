"""The frontier and what-if fleets over HTTP: plan the fleets in turn, store every plan
(inline, or in a job's worker).

Every plan is stored like any other (`GET /v1/plans/{id}`): a frontier point with the
requested scenario (a sub-fleet's plan is a plan of the whole fleet with GPUs idle), a
what-if variant with the variant's own scenario, whose `sources` name the change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import planner
from api.errors import json_safe
from api.services.planning import Solver, fleet_solve, store_result
from api.services.scenarios import Assembled
from api.storage import Store
from planner import fleet
from planner.documents import dump_document
from planner.search.api import ProgressCallback

__all__ = ["sweep_s", "check_prices", "check_variants", "frontier_and_store",
           "what_if_and_store"]


def sweep_s(num_plans: int, options: planner.SearchOptions) -> float:
    """The longest a sweep of `num_plans` searches may run; above the server's
    `max_time_limit_s` it is a job rather than an inline answer."""
    return num_plans * options.time_limit_s


def check_prices(scenario: planner.Scenario) -> None:
    """`InvalidScenario` for a GPU type without a price: checked before a frontier job is
    queued, so the request is answered 422 rather than a job that fails."""
    fleet.check_prices(scenario)


def check_variants(scenario: planner.Scenario, variants: list[fleet.FleetVariant]) -> None:
    """`InvalidScenario` naming the first variant that cannot apply, before a job is
    queued (as the inline answer checks them before planning)."""
    for i, variant in enumerate(variants):
        try:
            fleet.apply_variant(scenario, variant)
        except planner.InvalidScenario as error:
            raise planner.InvalidScenario([replace(p, path=f"variants[{i}].{p.path}")
                                           for p in error.problems]) from None


def frontier_and_store(assembled: Assembled, options: planner.SearchOptions, max_fleets: int,
                       *, solver: Solver, store: Store, progress: ProgressCallback | None = None,
                       check: Callable[[], None] | None = None) -> dict[str, Any]:
    """The cost/throughput frontier of the assembled scenario, each point stored.
    `progress` hears after each fleet; `check()` while a fleet's search runs (a job's
    cancel: it raises, and the search is stopped)."""
    started = time.monotonic()
    fleet.check_prices(assembled.scenario)
    fleets = fleet.sub_fleets(assembled.scenario, max_fleets)
    points = fleet.frontier(fleet.plan_fleets(fleets, options, progress=progress,
                                              solve=fleet_solve(solver, check)))
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
                      options: planner.SearchOptions, *, solver: Solver, store: Store,
                      progress: ProgressCallback | None = None,
                      check: Callable[[], None] | None = None) -> dict[str, Any]:
    """The base fleet and every variant planned, with changes against the base; each
    variant's plan stored with the variant's scenario. `progress` and `check` as for
    `frontier_and_store`."""
    rows = fleet.what_if(assembled.scenario, variants, options, progress=progress,
                         solve=fleet_solve(solver, check))
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
