"""What a job stores so that any worker can run it, and running it there.

A job's `request` column holds the assembled scenario document (as the planner saw it),
its sources, the search options and, for a sweep, its fleets (`max_fleets`) or variants:
a worker on another machine rebuilds the same search from it, without the catalogue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import planner
from api.errors import json_safe
from api.services import fleets
from api.services.planning import Solver, solve_and_store
from api.services.scenarios import Assembled
from api.storage import JobKind, Store
from planner.documents import Schedule
from planner.fleet import FleetVariant, Objective, ObjectiveOptions
from planner.search.api import ProgressCallback

__all__ = ["JobOutcome", "job_request", "run_request"]


@dataclass(frozen=True, kw_only=True)
class JobOutcome:
    plan_id: str | None = None
    """A plan job's stored plan."""
    result: dict[str, Any] | None = None
    """A sweep's answer (the body an inline request would have had)."""


def job_request(assembled: Assembled, options: planner.SearchOptions, *,
                max_fleets: int | None = None,
                variants: list[FleetVariant] | None = None) -> dict[str, Any]:
    """The stored request of a job: everything its worker needs, as JSON."""
    request: dict[str, Any] = {"scenario": json_safe(assembled.document),
                               "sources": json_safe(assembled.sources),
                               "options": _encode_options(options)}
    if max_fleets is not None:
        request["max_fleets"] = max_fleets
    if variants is not None:
        request["variants"] = [v.model_dump(mode="json") for v in variants]
    return request


def run_request(kind: JobKind, request: dict[str, Any], *, solver: Solver, store: Store,
                progress: ProgressCallback, check: Callable[[], None],
                observe: Callable[[str, float], None] | None = None) -> JobOutcome:
    """Run a stored request: its plans are stored; `progress` hears the job's progress,
    `check()` is called while each sweep's search runs (it raises to stop it)."""
    assembled = Assembled(scenario=planner.parse_scenario(request["scenario"]),
                          document=request["scenario"], sources=request["sources"])
    options = _decode_options(request["options"])
    if kind is JobKind.PLAN:
        record = solve_and_store(assembled, options, solver=solver, store=store,
                                 progress=progress, observe=observe)
        return JobOutcome(plan_id=record.id)
    if kind is JobKind.PARETO:
        return JobOutcome(result=fleets.frontier_and_store(
            assembled, options, int(request["max_fleets"]), solver=solver, store=store,
            progress=progress, check=check))
    variants = [FleetVariant.model_validate(v) for v in request["variants"]]
    return JobOutcome(result=fleets.what_if_and_store(
        assembled, variants, options, solver=solver, store=store, progress=progress,
        check=check))


def _encode_options(options: planner.SearchOptions) -> dict[str, Any]:
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    fields["schedules"] = [s.value for s in options.schedules]
    return {"goal": isinstance(options, ObjectiveOptions), "fields": json_safe(fields)}


def _decode_options(stored: dict[str, Any]) -> planner.SearchOptions:
    cls = ObjectiveOptions if stored["goal"] else planner.SearchOptions
    known = {f.name for f in dataclasses.fields(cls)}  # a newer server may store more
    fields = {k: v for k, v in stored["fields"].items() if k in known}
    fields["schedules"] = tuple(Schedule(s) for s in fields.get("schedules", ()))
    if "objective" in fields:
        fields["objective"] = Objective(fields["objective"])
    return cls(**fields)
