"""Public entry point of the search: `plan(scenario, options)`.

The search runs in four steps: compile cost tables; build pipeline templates
with exact layer splits; choose how many pipelines of each template to run
(CP-SAT, under caps on the number of pipelines and on sync time, since the
sync ring grows with data parallelism: `allocation_runs.py`); then split the
batch, place stages on concrete GPUs and judge every finalist with the reference
estimator, the best plan's layer splits then polished by it (`judging.py`). The
three baselines are finalists too, so the result is never worse than them; so
are grids (`grids.py`), identical pipelines through several GPU types, built
beside the search after the per-type baseline. This module runs the steps in
order, the per-type baseline in a forked child where that pays.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from planner.documents import Plan, Scenario, Schedule
from planner.errors import Infeasible
from planner.estimate import Evaluation, estimate_section, evaluate
from planner.search.allocate import pareto, prune
from planner.search.allocation_runs import allocation_candidates
from planner.search.aside import Aside, usable_cores
from planner.search.baselines import as_per_type, launcher_baselines, per_type_candidates
from planner.search.diagnose import infeasibility_reason, no_plan_reason
from planner.search.drafts import Candidate
from planner.search.exact import TooLargeForExact, check_size, exact_optimum
from planner.search.exchange import exchanged_candidates
from planner.search.grids import GridFamilies, grid_candidates
from planner.search.judging import (
    Judged,
    baseline_finalists,
    judge,
    judged,
    share_of_time_so_far,
)
from planner.search.launchers import (
    LAUNCHER_GRID_DRAFTS,
    best_for_launcher,
    check_launcher,
    launcher_candidates,
    runnable_by,
)
from planner.search.schedules import (
    LOCAL_TRAINING_NOTE,
    allowed_schedules,
    base_scenario,
    common_blocks,
    schedule_variants,
)
from planner.search.tables import ScenarioTables, compile_tables
from planner.search.templates import PipelineTemplate, generate_templates
from planner.space_bound import SpaceBound, space_bound

__all__ = ["PlanStatus", "SearchOptions", "PlanResult", "plan"]

PLANNER_VERSION = "0.1.0"
EXACT_SHARE = 0.8
"""Share of the time limit the default search gives exact enumeration on small scenarios."""
VARIANT_SHARE = 0.25
"""Share of the search's time so far that building and judging schedule variants may add."""
VARIANT_MIN_S = 0.2
LOCAL_SHALLOW_STAGES = (2, 4)
"""Under `local`, the allocation also runs over the templates of at most these many stages."""
LOCAL_FINALISTS = 4
"""Under `local`, this many times `finalists` candidates are given a shared split and
judged: the quick estimate misranks them (it leaves out heads and the shared split)."""

ProgressCallback = Callable[[float, str], None]
"""Called with (fraction done in [0, 1], what the search is doing)."""


class PlanStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    HEURISTIC = "heuristic"


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    time_limit_s: float = 10.0
    """Wall-clock budget of the search's time-limited steps (allocation runs, exact
    enumeration, polishing, schedule variants); the best plan found by then is returned.
    The steps that build cost tables, templates, baselines and grids run to the end
    whatever the limit: on 2 cores about 0.6 s + 0.3 ms per GPU + 2.5e-5 s per layer
    squared, which a short limit on a large fleet is exceeded by."""
    num_workers: int = 1
    """CP-SAT search workers."""
    exact: bool = False
    """Enumerate every plan of a small scenario and return the proven optimum (status
    `optimal`); refused with an error naming the limit when the scenario is too large."""
    finalists: int = 8
    """Candidate plans judged by the full estimator (event simulation and sync rings)."""
    launcher: str | None = None
    """Return the best plan this launcher format can run (`megatron`, `deepspeed`,
    `torchtitan`, ...: one grid of identical pipelines) instead of the best plan."""
    enumerate_small: bool = True
    """On scenarios within exact mode's limits, also run its enumeration from the search's
    best plan, for up to 80% of the time limit (status `optimal` when it finishes)."""
    parallel_allocations: int = 2
    """Allocation runs (pipeline caps, sync subsets) solved at once in threads; CP-SAT
    releases the GIL while it solves. At most the cores left beside the per-type baseline's
    forked child. The plan is the same for any value."""
    schedules: tuple[Schedule, ...] = ()
    """Schedules the plan may use; empty: the job's own. With `interleaved-1f1b` the search
    tries virtual stages (2 to 4 chunks per stage) on its best plans. `local` may be given
    only for a job whose schedule is `local`, and only alone."""
    recompute: bool = False
    """Let stages recompute activations (keep only each micro-batch's input) where that lets
    a plan run larger micro-batches or fit at all."""
    max_local_blocks: int | None = None
    """Under `local`, the most blocks (stages) a pipeline may have: local learning loses
    accuracy as blocks multiply, so the user sets it. None: no cap."""

    def __post_init__(self) -> None:
        if self.max_local_blocks is not None and self.max_local_blocks < 1:
            raise ValueError(f"max_local_blocks is {self.max_local_blocks}; it must be at least "
                             "1 (one block is plain data parallelism) or None for no cap")
        object.__setattr__(self, "schedules", tuple(Schedule(s) for s in self.schedules))


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    plan: Plan
    """The plan document, with `estimate` and a `search` section saying how it was found."""
    evaluation: Evaluation
    status: PlanStatus
    wall_s: float
    unused_gpus: dict[str, str] = field(default_factory=dict)
    """GPU name -> why the plan leaves it idle."""
    baselines: dict[str, float | None] = field(default_factory=dict)
    """Baseline name -> samples/s (None where the baseline has no valid plan)."""


def plan(
    scenario: Scenario,
    options: SearchOptions | None = None,
    progress: ProgressCallback | None = None,
) -> PlanResult:
    """The best plan the search finds for `scenario` within the options' time limit."""
    with _collector_slowed():
        return _plan(scenario, options or SearchOptions(), progress)


_collector_lock = threading.Lock()
_searches_running = 0
_collector_thresholds: tuple[int, int, int] = (700, 10, 10)
SEARCH_GC_THRESHOLDS = (50_000, 20, 20)
"""Collector thresholds while searches run: collections about seventy times rarer."""


@contextlib.contextmanager
def _collector_slowed() -> Iterator[None]:
    """Make Python's cyclic garbage collector run rarely while searches run. A search
    creates millions of short-lived, acyclic objects (freed by reference counting anyway),
    and each full collection walks every live template and plan: at thousands of GPUs that
    was a quarter of the search; with these thresholds it is a few percent. The collector
    is slowed, not stopped, so a service planning without pause still collects. Concurrent
    searches (the service's worker threads) share one count: the thresholds come back when
    the last one ends."""
    global _searches_running, _collector_thresholds
    with _collector_lock:
        if _searches_running == 0:
            _collector_thresholds = gc.get_threshold()
            gc.set_threshold(*SEARCH_GC_THRESHOLDS)
        _searches_running += 1
    try:
        yield
    finally:
        with _collector_lock:
            _searches_running -= 1
            if _searches_running == 0:
                gc.set_threshold(*_collector_thresholds)


def _plan(
    scenario: Scenario, options: SearchOptions, progress: ProgressCallback | None
) -> PlanResult:
    started = time.monotonic()
    report = progress or (lambda fraction, message: None)
    report(0.0, "compiling cost tables")
    allowed = allowed_schedules(scenario, options.schedules)
    local = scenario.job.schedule is Schedule.LOCAL
    if options.exact:
        if local:
            raise TooLargeForExact(
                "exact mode enumerates pipelines each with its own layer split, which schedule "
                "'local' forbids (every pipeline shares its blocks): plan this job without "
                "exact mode")
        check_size(scenario)  # refused before anything is built
    if options.launcher is not None:
        check_launcher(options.launcher)
    # An interleaved job is searched as 1F1B (v = 1), its chunks chosen afterwards.
    searched = base_scenario(scenario)
    # Under `local`, the user's cap on blocks bounds every pipeline the search builds.
    tables = compile_tables(searched, max_stages=options.max_local_blocks if local else None)
    _check_feasible(tables)
    # The per-type baseline, the costliest, needs no template: started first, beside
    # everything that follows, and the grids after it (they rank tp by its templates).
    # Under `local` the search's own path is the longer one (three allocation runs, the
    # shared splits): the child builds the launcher baselines too (BENCHMARKS 9).
    with Aside(functools.partial(_beside, searched, tables, launchers=local),
               fork=_worth_forking(tables)) as beside_ready:
        search = _Search(scenario=scenario, searched=searched, tables=tables, allowed=allowed,
                         options=options, started=started, report=report)
        return _searched(search, beside_ready)


@dataclass(frozen=True, kw_only=True)
class _Search:
    """What every step of one search reads."""

    scenario: Scenario
    """As the user gave it."""
    searched: Scenario
    """As the search plans it (`base_scenario`: an interleaved job as 1F1B)."""
    tables: ScenarioTables
    allowed: tuple[Schedule, ...]
    """Schedules the plan may use."""
    options: SearchOptions
    started: float
    """`time.monotonic()` when the search began."""
    report: ProgressCallback

    @property
    def local(self) -> bool:
        return self.scenario.job.schedule is Schedule.LOCAL


def _searched(search: _Search, beside_ready: Aside[Beside]) -> PlanResult:
    """The search proper, the baselines running beside it."""
    options, report = search.options, search.report
    report(0.05, "building pipeline templates")
    templates = _offered_templates(search.tables, search.searched)
    report(0.3, f"allocating GPUs over {len(templates)} pipeline templates")
    allocated, proven = _allocated(search, templates, forked=beside_ready.forked)
    # Identical replicas of one template, at any count: what one-grid launchers run where
    # the count splits the batch evenly, and at times what the allocation's linear model
    # misses (it mixes templates more finely than their copies need).
    replicated = launcher_candidates(search.tables, templates, even=False)
    report(0.7, "building baselines")
    # Nothing needs the launcher baselines before the child is back: built and judged while
    # it still works, they cost no time where the child is the slower of the two.
    waited = _while_waiting(beside_ready, search.searched, search.tables, search.allowed,
                            launchers=not search.local,
                            candidates=[] if search.local else sorted(
                                [*allocated, *replicated],
                                key=lambda c: c.quick_s)[:options.finalists])
    beside = beside_ready.result()
    baselines = _baselines(search, beside, waited)
    candidates, families = _gathered(search, templates, allocated, replicated, baselines,
                                     beside.grids)
    # The allocation is proven only within its own model (templates, caps), never globally.
    status = PlanStatus.FEASIBLE if proven else PlanStatus.HEURISTIC
    report(0.8, f"judging {min(len(candidates), options.finalists)} finalists")
    best, evaluation, baseline_rates, runners_up = judge(
        search.searched, candidates, families, baselines,
        # The quick estimates leave out what local learning adds (heads, their rings) and
        # the shared split: every plan given one is judged.
        limit=len(candidates) if search.local else options.finalists,
        started=search.started, time_limit_s=options.time_limit_s, known=waited.judged)
    if options.launcher is not None:
        best, evaluation = _for_launcher(search, templates, candidates, best)
        runners_up = []
    elif not search.local and (options.exact
                               or (options.enumerate_small and _small_enough(search.searched))):
        best, evaluation, status = _exact(search.searched, best, evaluation, status, options,
                                          search.started, report)
    if best is not None and evaluation is not None and _widened(search.searched, search.allowed,
                                                                options):
        best, evaluation, status = _with_schedule_variant(search, best, evaluation, status,
                                                          runners_up)
    if best is None or evaluation is None:
        raise Infeasible(_local_reason(options) if search.local
                         else no_plan_reason(search.tables))
    wall_s = time.monotonic() - search.started
    unused = _unused_gpus(search.tables, best.plan)
    document = _annotate(best, evaluation, status, wall_s, unused, baseline_rates,
                         waited.bound if waited.bound_known
                         else space_bound(search.searched, search.allowed),
                         training=LOCAL_TRAINING_NOTE if search.local else None)
    report(1.0, "done")
    return PlanResult(plan=document, evaluation=evaluation, status=status, wall_s=wall_s,
                      unused_gpus=unused, baselines=baseline_rates)


def _allocated(search: _Search, templates: list[PipelineTemplate], *, forked: bool
               ) -> tuple[list[Candidate], bool]:
    """The allocation's candidates, and whether its model proved the best of them."""
    options = search.options
    # A forked child runs the per-type baseline on a core of its own: allocation threads
    # beyond the cores left only take turns with it (on 2 cores, one thread is 3-9% faster
    # at 512 GPUs, BENCHMARKS 3).
    threads = min(options.parallel_allocations, usable_cores() - forked)
    run = functools.partial(
        allocation_candidates, search.tables, time_limit_s=options.time_limit_s,
        num_workers=options.num_workers, finalists=options.finalists, started=search.started,
        report=search.report, threads=threads)
    allocated, proven = run(templates)
    if search.local:
        # Every block but the last trains a head, whose time and ring the templates leave
        # out: the allocation favours deep pipelines. Runs over shallow templates alone
        # offer the plans of few blocks that this hides.
        for most in LOCAL_SHALLOW_STAGES:
            shallow = [t for t in templates if t.num_stages <= most]
            if shallow and len(shallow) < len(templates):
                allocated += run(shallow)[0]
    return allocated, proven


def _baselines(search: _Search, beside: Beside, waited: _Waited) -> dict[str, Judged]:
    """The three baselines, judged: the launcher ones built here, while waiting or after
    (under `local` by the child), the per-type one by the child, with the homogeneous
    baseline's plans among its own."""
    if search.local:  # the child built them
        assert beside.launchers is not None
        baselines = dict(beside.launchers)
    else:
        baselines = _launcher_baselines(search.searched, search.tables, waited.launchers,
                                        known=waited.judged)
    baselines["per_type"] = sorted(
        beside.per_type + [(as_per_type(c), e) for c, e in baselines["homogeneous"]],
        key=lambda judged: judged[0].quick_s)
    return baselines


def _gathered(search: _Search, templates: list[PipelineTemplate], allocated: list[Candidate],
              replicated: list[Candidate], baselines: dict[str, Judged], grids: GridFamilies
              ) -> tuple[list[Candidate], list[list[Candidate]]]:
    """Every candidate for the finalists, and the families judged beside them."""
    candidates = [*allocated, *replicated]
    candidates.extend(c for group in baselines.values() for c, _ in group)
    candidates.extend(grids.even)
    candidates.extend(grids.with_idle)
    if search.local:
        # Only plans whose pipelines share their blocks are valid: give them one split.
        return common_blocks(search.tables, candidates,
                             limit=LOCAL_FINALISTS * search.options.finalists), []
    # Judged beside the finalists, never in place of one: a quote that is merely
    # optimistic must not push a better candidate out.
    return candidates, [allocated, replicated, grids.even, grids.with_idle,
                        exchanged_candidates(search.tables, templates, candidates)]


def _for_launcher(search: _Search, templates: list[PipelineTemplate],
                  candidates: list[Candidate], best: Candidate | None
                  ) -> tuple[Candidate | None, Evaluation | None]:
    """The best plan the named launcher runs (`SearchOptions.launcher`)."""
    launcher = search.options.launcher
    assert launcher is not None
    search.report(0.9, f"restricting to what {launcher} runs")
    offered = [*candidates, *launcher_candidates(search.tables, templates, LAUNCHER_GRID_DRAFTS,
                                                  slack=math.inf)]
    if best is not None:
        offered.append(best)
    return best_for_launcher(search.searched, launcher, offered, search.options.finalists)


def _with_schedule_variant(search: _Search, best: Candidate, evaluation: Evaluation,
                           status: PlanStatus, runners_up: list[tuple[Candidate, Evaluation]]
                           ) -> tuple[Candidate, Evaluation, PlanStatus]:
    """The best plan, or its variant under another allowed schedule or recomputation where
    that is faster (or where the job's own schedule was not searched)."""
    search.report(0.95, "trying other schedules on the best plans")
    bases = [(best, evaluation)] + [j for j in runners_up if j[0] is not best]
    # Variants are judged one full evaluation each: they get a share of the time the
    # search took, so allowing schedules costs planning time in proportion.
    options = search.options
    varied = schedule_variants(
        search.scenario, search.tables, bases, search.allowed, recompute=options.recompute,
        deadline=share_of_time_so_far(search.started, options.time_limit_s, VARIANT_SHARE,
                                       VARIANT_MIN_S))
    # An interleaved job's plan must take a variant: the search planned it as 1F1B.
    must_change = _plan_schedule(best.plan, search.searched) not in search.allowed
    if varied is not None and options.launcher is not None and not runnable_by(
            search.scenario, options.launcher, varied[0].plan):
        varied = None  # the named launcher could not run it
    if varied is None or not (must_change or (varied[1].iteration_s or math.inf)
                              < (evaluation.iteration_s or math.inf)):
        return best, evaluation, status
    # An optimum is proven among the searched schedule's plans only.
    return (*varied, PlanStatus.HEURISTIC if status is PlanStatus.OPTIMAL else status)


def _offered_templates(tables: ScenarioTables, searched: Scenario) -> list[PipelineTemplate]:
    """The pipeline templates the allocation and the replicas choose from: of those using
    the same GPUs, the few of best throughput, and of those, the ones no other template of
    their micro-batch size beats on GPUs of every class, rate, fill and sync."""
    templates = generate_templates(tables, searched.job.schedule)
    if searched.job.zero_stage >= 1:
        # Sharded state fits deeper into memory once there are several pipelines: a second
        # pass sizes homogeneous pipelines for eight (the two-segment ones stay sized for
        # one, valid at any count; sharded copies of them changed no plan and doubled the
        # templates). Splits that memory did not bind come out the same: kept once.
        known = {t.signature for t in templates}
        templates += [t for t in generate_templates(tables, searched.job.schedule,
                                                    num_pipelines_hint=8, two_segment=False)
                      if t.signature not in known]
    return pareto(prune(templates), [c.key for c in tables.classes], num_pipelines=8)


@dataclass
class _Waited:
    """What the search did while its forked child still worked."""

    judged: dict[int, Evaluation] = field(default_factory=dict)
    """Candidate id -> its evaluation."""
    bound_known: bool = False
    bound: SpaceBound | None = None
    """The upper bound on samples/s, where `bound_known`."""
    launchers: dict[str, list[Candidate]] | None = None
    """The launcher baselines' candidates, where built."""


def _while_waiting(beside_ready: Aside[Beside], scenario: Scenario, tables: ScenarioTables,
                   allowed: tuple[Schedule, ...], *, launchers: bool,
                   candidates: list[Candidate]) -> _Waited:
    """While the forked child works on, do what the search does anyway once the child is
    done, one piece at a time until it is: build the launcher baselines (where asked) and
    judge their finalists, compute the bound, judge the search's best `candidates` (which
    may then prove needless: a core's idle time spent). The plan is the same whoever
    finishes first."""
    waited = _Waited()
    if not beside_ready.forked:
        return waited  # a thread would only take turns with this one
    work = _waiting_work(waited, scenario, tables, allowed, launchers, candidates)
    while not beside_ready.done() and next(work, None) is not None:
        pass
    return waited


def _waiting_work(waited: _Waited, scenario: Scenario, tables: ScenarioTables,
                  allowed: tuple[Schedule, ...], launchers: bool, candidates: list[Candidate]
                  ) -> Iterator[bool]:
    """`_while_waiting`'s pieces, in order: each yields True once it is done."""
    if launchers:
        waited.launchers = launcher_baselines(tables)
        yield True
        for group in waited.launchers.values():
            for candidate in baseline_finalists(group):
                waited.judged[id(candidate)] = evaluate(scenario, candidate.plan)
                yield True
    waited.bound, waited.bound_known = space_bound(scenario, allowed), True
    yield True
    for candidate in candidates:
        waited.judged[id(candidate)] = evaluate(scenario, candidate.plan)
        yield True


def _local_reason(options: SearchOptions) -> str:
    cap = options.max_local_blocks
    return ("no plan found under schedule 'local' whose pipelines share one set of blocks"
            + ("" if cap is None else f" of at most {cap} block(s) (max_local_blocks)")
            + " and fit in memory with the head on every block but the last; "
            + ("raise max_local_blocks, " if cap is not None else "")
            + "add GPUs or memory, or profile smaller micro-batches")


def _plan_schedule(plan_doc: Plan, scenario: Scenario) -> Schedule:
    return plan_doc.schedule or scenario.job.schedule


def _widened(scenario: Scenario, allowed: tuple[Schedule, ...], options: SearchOptions) -> bool:
    """Whether the plan may use more than the searched schedule, or recomputation."""
    return options.recompute or allowed != (scenario.job.schedule,)


def _small_enough(scenario: Scenario) -> bool:
    """Whether exact mode's enumeration takes the scenario: the default search then runs it
    too, within its time limit, from its own best plan (templates split layers for the
    bottleneck and model pipelines as linear in their micro-batches; with few GPUs and
    micro-batches, neither holds well)."""
    try:
        check_size(scenario)
    except TooLargeForExact:
        return False
    return True


def _exact(
    scenario: Scenario,
    best: Candidate | None,
    evaluation: Evaluation | None,
    status: PlanStatus,
    options: SearchOptions,
    started: float,
    report: ProgressCallback,
) -> tuple[Candidate | None, Evaluation | None, PlanStatus]:
    """The proven optimum, the default search's plan as the first bound. Past the time limit
    the best plan found so far comes back, not proven."""
    deadline = started + options.time_limit_s * (1.0 if options.exact else EXACT_SHARE)
    found = exact_optimum(
        scenario, incumbent=None if best is None else best.plan, deadline=deadline,
        progress=lambda fraction, message: report(0.8 + 0.19 * fraction, message))
    if found is None:
        return best, evaluation, status
    if not found.proven:
        if not options.exact and found.plan is (best.plan if best else None):
            return best, evaluation, status  # nothing better found in the time given
        origin = (f"exact enumeration stopped at the time limit ({options.time_limit_s:g} s) "
                  f"after {found.num_plans} partial plans; best plan found so far")
        return (Candidate.of(found.plan, quick_s=found.evaluation.iteration_s or math.inf,
                             origin=origin), found.evaluation, PlanStatus.HEURISTIC)
    origin = (f"exact enumeration: branch and bound over {found.num_structures} pipeline "
              f"structures ({found.num_plans} partial plans)")
    return (Candidate.of(found.plan, quick_s=found.evaluation.iteration_s or math.inf,
                         origin=origin), found.evaluation, PlanStatus.OPTIMAL)


def _check_feasible(tables: ScenarioTables) -> None:
    reason = infeasibility_reason(tables)
    if reason is not None:
        raise Infeasible(reason)


@dataclass(frozen=True)
class Beside:
    """What runs beside the search: the per-type baseline (under `local`, the launcher
    baselines too), judged, and the grids. From a forked child the candidates come
    unbuilt, as their templates and placements: the parent builds the plan of the few it
    reads (building and pickling every plan document took 0.07-0.1 s of the child's path
    at 512 GPUs, BENCHMARKS 3)."""

    per_type: Judged
    grids: GridFamilies
    """The grids' placed candidates (`grid_candidates`)."""
    launchers: dict[str, Judged] | None
    """The `homogeneous` and `unaware` baselines, where asked for here."""


def _beside(scenario: Scenario, tables: ScenarioTables, *, launchers: bool) -> Beside:
    return Beside(per_type=judged(scenario, per_type_candidates(tables)),
                  grids=grid_candidates(tables),
                  launchers=_launcher_baselines(scenario, tables) if launchers else None)


def _launcher_baselines(scenario: Scenario, tables: ScenarioTables,
                        built: dict[str, list[Candidate]] | None = None, *,
                        known: dict[int, Evaluation] | None = None) -> dict[str, Judged]:
    """The `homogeneous` and `unaware` baselines judged (`built`: their candidates, where
    built before; `known`: evaluations computed before)."""
    groups = launcher_baselines(tables) if built is None else built
    return {name: judged(scenario, group, known) for name, group in groups.items()}


FORK_FROM_GPUS = 128
"""From this many GPUs, the per-type baseline runs in a forked child (when the process may fork):
below, it takes less time than a fork and the pickling of its candidates."""


def _worth_forking(tables: ScenarioTables) -> bool:
    return tables.num_gpus >= FORK_FROM_GPUS


def _unused_gpus(tables: ScenarioTables, plan_doc: Plan) -> dict[str, str]:
    used = {g for p in plan_doc.pipelines for s in p.stages for g in s.gpus}
    unused = {}
    for cls in tables.classes:
        for node in cls.nodes:
            for i in range(node.gpus):
                name = f"{node.name}:{i}"
                if name not in used:
                    unused[name] = ("left idle: no pipeline using it finished its share of the "
                                    "batch sooner than the plan's slowest pipeline")
    return unused


def _annotate(
    best: Candidate,
    evaluation: Evaluation,
    status: PlanStatus,
    wall_s: float,
    unused: dict[str, str],
    baselines: dict[str, float | None],
    space: SpaceBound | None,
    *,
    training: str | None = None,
) -> Plan:
    estimate: dict[str, Any] = estimate_section(evaluation)
    bound = evaluation.compute_bound_iteration_s
    search = {
        "solver": "cp-sat allocation over DP-split pipeline templates",
        "origin": best.origin,
        "status": status.value,
        "compute_bound_iteration_s": bound,
        "gap_to_compute_bound": None if bound is None or evaluation.iteration_s is None
        else 1.0 - bound / evaluation.iteration_s,
        "wall_s": wall_s,
        "planner_version": PLANNER_VERSION,
        "baselines_samples_per_s": baselines,
        "num_unused_gpus": len(unused),
        # Counts memory, sync, node crossings and the fill: see planner/space_bound.py.
        "upper_bound_samples_per_s": None if space is None else space.samples_per_s,
        "gap_to_upper_bound": None if space is None or evaluation.samples_per_s is None
        else 1.0 - evaluation.samples_per_s / space.samples_per_s,
    }
    if training is not None:
        search["training"] = training  # what the plan's schedule trains, when not end to end
    return best.plan.model_copy(update={"estimate": estimate, "search": search})
