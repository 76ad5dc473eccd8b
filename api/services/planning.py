"""Solve a plan request and record the result; evaluate a plan against a scenario."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import planner
from api import schemas
from api.errors import ApiError, ScenarioTooLarge, json_safe
from api.services.scenarios import Assembled
from api.settings import Settings
from api.solving import untimed_s
from api.storage import PlanRecord, Store
from planner.documents import Schedule, dump_document
from planner.errors import Problem
from planner.estimate import with_estimate
from planner.fleet import Objective, ObjectiveOptions, Solve, plan_with_objective, sub_fleets
from planner.search.api import ProgressCallback

__all__ = [
    "Solver",
    "effective_options",
    "with_goal",
    "plan_options",
    "has_goal",
    "answers_inline",
    "search_runs",
    "untimed_past_threshold",
    "check_size",
    "solve_and_store",
    "store_result",
    "fleet_solve",
    "evaluate",
    "plan_public",
    "plan_summary",
]

Solver = Callable[[planner.Scenario, planner.SearchOptions, ProgressCallback | None],
                  planner.PlanResult]
"""What the service calls to plan: `planner.plan` in production, a fake in some tests."""


def effective_options(requested_time_limit_s: float | None, exact: bool,
                      settings: Settings, *, schedules: Sequence[Schedule] = (),
                      recompute: bool = False, max_local_blocks: int | None = None,
                      launcher: str | None = None) -> planner.SearchOptions:
    """The search options actually used: the request's time limit, capped by the server,
    and its schedule choices."""
    limit = requested_time_limit_s or settings.default_time_limit_s
    chosen: dict[str, Any] = {"time_limit_s": min(limit, settings.max_time_limit_s)}
    if exact and "exact" in {f.name for f in dataclasses.fields(planner.SearchOptions)}:
        chosen["exact"] = True
    return planner.SearchOptions(**chosen, schedules=tuple(schedules), recompute=recompute,
                                 max_local_blocks=max_local_blocks, launcher=launcher)


def with_goal(options: planner.SearchOptions,
              requested: schemas.PlanOptions) -> planner.SearchOptions:
    """`options` with the request's goal in money (`objective`, `max_usd_per_hour`,
    `min_samples_per_s`), when it has one."""
    goal = ObjectiveOptions(**{f.name: getattr(options, f.name)
                               for f in dataclasses.fields(options)},
                            objective=Objective(requested.objective),
                            max_usd_per_hour=requested.max_usd_per_hour,
                            min_samples_per_s=requested.min_samples_per_s)
    return goal if goal.needs_fleets else options


def plan_options(requested: schemas.PlanOptions, settings: Settings) -> planner.SearchOptions:
    """The options a plan request is searched with: its own, capped by the server, and its
    goal in money when it has one."""
    return with_goal(effective_options(
        requested.time_limit_s, requested.exact, settings, schedules=requested.schedules or (),
        recompute=requested.recompute, max_local_blocks=requested.max_local_blocks,
        launcher=requested.launcher), requested)


def has_goal(options: planner.SearchOptions) -> bool:
    """Whether the options carry a goal in money (planned over sub-fleets)."""
    return isinstance(options, ObjectiveOptions)


def answers_inline(budget_s: float, settings: Settings) -> bool:
    """Whether a search whose time-limited steps may run `budget_s` is answered inline
    (201), not as a job (see also `untimed_past_threshold`)."""
    return budget_s <= settings.sync_solve_threshold_s


def search_runs(scenario: planner.Scenario, options: planner.SearchOptions) -> int:
    """Searches the request runs: one per sub-fleet under a goal in money (whose answer
    plans them in turn), else one."""
    if isinstance(options, ObjectiveOptions):
        return len(sub_fleets(scenario, options.max_fleets))
    return 1


def untimed_past_threshold(scenario: planner.Scenario, runs: int, settings: Settings) -> bool:
    """Whether the steps of `runs` searches that no time limit governs (templates and
    baselines, which grow with GPUs and with layers squared) would alone hold an inline
    answer past the server's threshold: such a request becomes a job whatever its time
    limit (a 1,024-layer model takes tens of seconds)."""
    return runs * untimed_s(scenario) > settings.sync_solve_threshold_s


def check_size(scenario: planner.Scenario, settings: Settings) -> None:
    """`ScenarioTooLarge` naming the limit when `scenario` has more layers or GPUs than the
    server plans: checked before any search, whose memory grows with layers x layers."""
    layers = len(scenario.model.layers)
    gpus = scenario.cluster.num_gpus
    problems = []
    if layers > settings.max_plan_layers:
        problems.append(Problem(path="model.layers", value=layers, message=(
            f"{layers} layers is above this server's limit of {settings.max_plan_layers} "
            "(HETPLAN_MAX_PLAN_LAYERS); profile coarser layers (e.g. one per block)")))
    if gpus > settings.max_plan_gpus:
        problems.append(Problem(path="cluster.nodes", value=gpus, message=(
            f"{gpus} GPUs is above this server's limit of {settings.max_plan_gpus} "
            "(HETPLAN_MAX_PLAN_GPUS); plan a part of the cluster")))
    if problems:
        raise ScenarioTooLarge("the scenario is too large to plan here: " +
                               "; ".join(p.message for p in problems), problems=problems)


def solve_and_store(
    assembled: Assembled,
    options: planner.SearchOptions,
    *,
    solver: Solver,
    store: Store,
    progress: ProgressCallback | None = None,
    observe: Callable[[str, float], None] | None = None,
) -> PlanRecord:
    """Run the solver, store the plan with its sources, and return the stored record.
    `observe(status, seconds)` is told every solve's outcome (for metrics)."""
    started = time.perf_counter()
    try:
        if isinstance(options, ObjectiveOptions):  # each sub-fleet planned by the solver
            result = plan_with_objective(assembled.scenario, options, progress,
                                         solve=fleet_solve(solver))
        else:
            result = solver(assembled.scenario, options, progress)
    except Exception as error:
        if observe is not None:
            observe(type(error).__name__, time.perf_counter() - started)
        raise
    if observe is not None:
        observe(str(result.status), result.wall_s)
    return store_result(assembled, options, result, store=store)


def fleet_solve(solver: Solver, check: Callable[[], None] | None = None) -> Solve:
    """The service's solver as `planner.fleet` plans one fleet with it: a fleet the solver
    refuses (an error rendered by a search process) is that fleet's outcome, not the
    request's answer. `check()`, when given, is called as the search reports progress
    (a job's cancel raises there, and the search is stopped)."""
    watch = None if check is None else (lambda _fraction, _message: check())

    def solve(scenario: planner.Scenario, options: planner.SearchOptions) -> planner.PlanResult:
        try:
            return solver(scenario, options, watch)
        except ApiError as error:
            raise planner.PlannerError(f"{error.code}: {error.message}") from None

    return solve


def store_result(assembled: Assembled, options: planner.SearchOptions,
                 result: planner.PlanResult, *, store: Store) -> PlanRecord:
    """Store one search result with its sources and options; the stored record."""
    record = PlanRecord(
        id=uuid.uuid4().hex,
        created_at=datetime.now(UTC),
        status=str(result.status),
        wall_s=float(result.wall_s),
        document=json_safe(dump_document(with_estimate(result.plan, result.evaluation))),
        evaluation=json_safe(result.evaluation.to_dict()),
        unused_gpus=dict(result.unused_gpus),
        sources=assembled.sources,
        options={"time_limit_s": options.time_limit_s,
                 "exact": bool(getattr(options, "exact", False)),
                 **_schedule_options(options), **_goal(options)},
        scenario=json_safe(assembled.document),
    )
    store.add_plan(record)
    return record


def _goal(options: planner.SearchOptions) -> dict[str, Any]:
    if not isinstance(options, ObjectiveOptions):
        return {}
    return {"objective": options.objective.value, "max_usd_per_hour": options.max_usd_per_hour,
            "min_samples_per_s": options.min_samples_per_s}


def _schedule_options(options: planner.SearchOptions) -> dict[str, Any]:
    """The schedule choices a request made, recorded only when it made some (older records
    and plain requests keep their two keys)."""
    chosen: dict[str, Any] = {}
    if options.schedules:
        chosen["schedules"] = [s.value for s in options.schedules]
    if options.recompute:
        chosen["recompute"] = True
    if options.max_local_blocks is not None:
        chosen["max_local_blocks"] = options.max_local_blocks
    if options.launcher is not None:
        chosen["launcher"] = options.launcher
    return chosen


def evaluate(assembled: Assembled, plan_document: dict[str, Any]) -> dict[str, Any]:
    """The cost model's numbers for a plan (docs/formats.md); an invalid plan is an answer, not an error."""
    plan = planner.parse_plan(plan_document)
    return json_safe(planner.evaluate(assembled.scenario, plan).to_dict())


def plan_public(record: PlanRecord) -> dict[str, Any]:
    return {
        "id": record.id, "created_at": record.created_at.isoformat(), "status": record.status,
        "wall_s": record.wall_s, "plan": record.document, "evaluation": record.evaluation,
        "unused_gpus": record.unused_gpus, "sources": record.sources,
        "options": record.options,
    }


def plan_summary(record: PlanRecord) -> dict[str, Any]:
    return {
        "id": record.id, "created_at": record.created_at, "status": record.status,
        "wall_s": record.wall_s, "iteration_s": record.evaluation.get("iteration_s"),
        "samples_per_s": record.evaluation.get("samples_per_s"),
        "usd_per_hour": record.evaluation.get("usd_per_hour"),
    }
