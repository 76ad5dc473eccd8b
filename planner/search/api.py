"""Public entry point of the search: `plan(scenario, options)`.

The search runs in four steps: compile cost tables; build pipeline templates
with exact layer splits; choose how many pipelines of each template to run
(CP-SAT, under caps on the number of pipelines and on sync time, since the
sync ring grows with data parallelism); then split the batch, place stages on
concrete GPUs and judge every finalist with the reference estimator; small
plans finally get their layer splits polished by it (`polish.py`). The three
baselines are finalists too, so the result is never worse than them; so are
grids (`grids.py`), identical pipelines through several GPU types, built beside
the search after the per-type baseline.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from planner.documents import Plan, Scenario, Schedule
from planner.errors import Infeasible
from planner.estimate import Evaluation, estimate_section, evaluate
from planner.search.allocate import RUNNERS_UP, Allocation, allocate, pareto, prune
from planner.search.aside import Aside, usable_cores
from planner.search.baselines import as_per_type, launcher_baselines, per_type_candidates
from planner.search.diagnose import infeasibility_reason, no_plan_reason
from planner.search.drafts import Candidate, Draft, best_realized, draft
from planner.search.exact import TooLargeForExact, check_size, exact_optimum
from planner.search.grids import grid_candidates
from planner.search.launchers import (
    LAUNCHER_GRID_DRAFTS,
    best_for_launcher,
    check_launcher,
    launcher_candidates,
    runnable_by,
)
from planner.search.polish import polish_plan
from planner.search.refine import rebalance
from planner.search.schedules import (
    LOCAL_TRAINING_NOTE,
    allowed_schedules,
    base_scenario,
    common_blocks,
    schedule_variants,
    within_block_cap,
)
from planner.search.tables import ScenarioTables, compile_tables
from planner.search.templates import ClassKey, PipelineTemplate, generate_templates
from planner.space_bound import SpaceBound, space_bound

__all__ = ["PlanStatus", "SearchOptions", "PlanResult", "plan"]

PLANNER_VERSION = "0.1.0"
REFINED = 3  # best finalists whose batch shares are then set by exact simulation
BASELINE_FINALISTS = 4  # placed candidates of each baseline judged by the estimator
FAMILY_FINALISTS = 2
"""Candidates of each family (allocation, identical replicas, grids) judged whatever the
other families' quick estimates."""
EXACT_SHARE = 0.8
"""Share of the time limit the default search gives exact enumeration on small scenarios."""
QUICK_SLACK = 1.1
"""Finalists whose quick estimate exceeds the best simulated time by more are not judged."""
VARIANT_SHARE = 0.25
"""Share of the search's time so far that building and judging schedule variants may add."""
VARIANT_MIN_S = 0.2
POLISH_SHARE = 0.5
"""Polishing the best plan's splits stops past this share of the search's time so far: a
guard for slow machines; its tries are counted (polish.py)."""
POLISH_MIN_S = 0.2

ProgressCallback = Callable[[float, str], None]
"""Called with (fraction done in [0, 1], what the search is doing)."""


class PlanStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    HEURISTIC = "heuristic"


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    time_limit_s: float = 10.0
    """Wall-clock budget of the whole search; the best plan found by then is returned."""
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
    tables = compile_tables(searched)
    _check_feasible(tables)
    # The per-type baseline, the costliest, needs no template: started first, beside
    # everything that follows, and the grids after it (they rank tp by its templates).
    with Aside(functools.partial(_beside, searched, tables),
               fork=_worth_forking(tables)) as beside_ready:
        return _searched(scenario, searched, tables, allowed, beside_ready, options, started,
                         report)


def _searched(
    scenario: Scenario,
    searched: Scenario,
    tables: ScenarioTables,
    allowed: tuple[Schedule, ...],
    beside_ready: Aside[Beside],
    options: SearchOptions,
    started: float,
    report: ProgressCallback,
) -> PlanResult:
    """The search proper, the baselines running beside it."""
    local = scenario.job.schedule is Schedule.LOCAL
    report(0.05, "building pipeline templates")
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
    max_blocks = options.max_local_blocks if local else None
    if max_blocks is not None:
        templates = [t for t in templates if len(t.stages) <= max_blocks]
    templates = pareto(prune(templates), [c.key for c in tables.classes], num_pipelines=8)
    report(0.3, f"allocating GPUs over {len(templates)} pipeline templates")
    # A forked child runs the per-type baseline on a core of its own: allocation threads
    # beyond the cores left only take turns with it (on 2 cores, one thread is 3-9% faster
    # at 512 GPUs, BENCHMARKS 3).
    threads = min(options.parallel_allocations, usable_cores() - beside_ready.forked)
    allocated, proven = _allocation_candidates(tables, templates, options, started, report,
                                               threads=threads)
    # Identical replicas of one template, at each count that splits the batch evenly:
    # what one-grid launchers run, and at times what the allocation's linear model misses.
    replicated = launcher_candidates(tables, templates)
    candidates = [*allocated, *replicated]
    report(0.7, "building baselines")
    baselines = {name: _judged(searched, group)
                 for name, group in launcher_baselines(tables).items()}
    waited = _while_waiting(beside_ready, searched, allowed,
                            [] if local else sorted([*allocated, *replicated],
                                                    key=lambda c: c.quick_s)[:options.finalists])
    beside = beside_ready.result()
    baselines["per_type"] = sorted(
        beside.per_type + [(as_per_type(c), e) for c, e in baselines["homogeneous"]],
        key=lambda judged: judged[0].quick_s)
    candidates.extend(c for group in baselines.values() for c, _ in group)
    candidates.extend(beside.grids)
    families = [allocated, replicated, beside.grids]
    if local:
        # Only plans whose pipelines share their blocks are valid: give them one split.
        candidates = common_blocks(tables, sorted(candidates, key=lambda c: c.quick_s)
                                   [:2 * options.finalists], max_blocks)
        families = []
    # The allocation is proven only within its own model (templates, caps), never globally.
    status = PlanStatus.FEASIBLE if proven else PlanStatus.HEURISTIC
    report(0.8, f"judging {min(len(candidates), options.finalists)} finalists")
    admissible = None if max_blocks is None else (
        lambda plan_doc: within_block_cap(plan_doc, max_blocks))
    best, evaluation, baseline_rates, runners_up = _judge(searched, candidates, families,
                                                          baselines, options, admissible,
                                                          started=started, known=waited.judged)
    if options.launcher is not None:
        report(0.9, f"restricting to what {options.launcher} runs")
        candidates.extend(launcher_candidates(tables, templates, LAUNCHER_GRID_DRAFTS,
                                              slack=math.inf))
        if best is not None:
            candidates.append(best)
        best, evaluation = best_for_launcher(searched, options.launcher, candidates,
                                             options.finalists)
        runners_up = []
    elif not local and (options.exact or (options.enumerate_small and _small_enough(searched))):
        best, evaluation, status = _exact(searched, best, evaluation, status, options, started,
                                          report)
    if best is not None and evaluation is not None and _widened(searched, allowed, options):
        report(0.95, "trying other schedules on the best plans")
        bases = [(best, evaluation)] + [j for j in runners_up if j[0] is not best]
        # Variants are judged one full evaluation each: they get a share of the time the
        # search took, so allowing schedules costs planning time in proportion.
        varied = schedule_variants(
            scenario, tables, bases, allowed, recompute=options.recompute,
            deadline=_share_of_time_so_far(started, options, VARIANT_SHARE, VARIANT_MIN_S))
        # An interleaved job's plan must take a variant: the search planned it as 1F1B.
        must_change = _plan_schedule(best.plan, searched) not in allowed
        if varied is not None and options.launcher is not None and not runnable_by(
                scenario, options.launcher, varied[0].plan):
            varied = None  # the named launcher could not run it
        if varied is not None and (must_change or (varied[1].iteration_s or math.inf)
                                   < (evaluation.iteration_s or math.inf)):
            best, evaluation = varied
            if status is PlanStatus.OPTIMAL:  # proven among the searched schedule's plans only
                status = PlanStatus.HEURISTIC
    if best is None or evaluation is None:
        raise Infeasible(_local_reason(options) if local else no_plan_reason(tables))
    wall_s = time.monotonic() - started
    unused = _unused_gpus(tables, best.plan)
    document = _annotate(best, evaluation, status, wall_s, unused, baseline_rates,
                         waited.bound if waited.bound_known else space_bound(searched, allowed),
                         training=LOCAL_TRAINING_NOTE if local else None)
    report(1.0, "done")
    return PlanResult(plan=document, evaluation=evaluation, status=status, wall_s=wall_s,
                      unused_gpus=unused, baselines=baseline_rates)


@dataclass
class _Waited:
    """What the search did while its forked child still worked."""

    judged: dict[int, Evaluation] = field(default_factory=dict)
    """Candidate id -> its evaluation."""
    bound_known: bool = False
    bound: SpaceBound | None = None
    """The upper bound on samples/s, where `bound_known`."""


def _while_waiting(beside_ready: Aside[Beside], scenario: Scenario,
                   allowed: tuple[Schedule, ...], candidates: list[Candidate]) -> _Waited:
    """While the forked child works on, compute the bound and judge the search's best
    `candidates`, in order: results the search would compute anyway once the child is
    done (or, for a candidate, maybe not: it is then spent on a core's idle time), so the
    plan is the same whoever finishes first."""
    waited = _Waited()
    if not beside_ready.forked:
        return waited  # a thread would only take turns with this one
    pending = iter(candidates)
    while not beside_ready.done():
        if not waited.bound_known:
            waited.bound, waited.bound_known = space_bound(scenario, allowed), True
        elif (candidate := next(pending, None)) is not None:
            waited.judged[id(candidate)] = evaluate(scenario, candidate.plan)
        else:
            break
    return waited


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


def _allocation_candidates(
    tables: ScenarioTables,
    templates: list[PipelineTemplate],
    options: SearchOptions,
    started: float,
    report: ProgressCallback,
    *,
    threads: int,
) -> tuple[list[Candidate], bool]:
    drafts: list[Draft | None] = []
    seen: set[tuple[tuple[int, int], ...]] = set()

    def add_drafts(found: Allocation, subset: list[PipelineTemplate], cap: int | None) -> None:
        for counts in found.visited:
            key = tuple(sorted((id(subset[k]), n) for k, n in counts.items()))
            if key in seen:  # caps and subsets often lead to the same allocation
                continue
            seen.add(key)
            pipelines = [subset[k] for k, n in sorted(counts.items()) for _ in range(n)]
            drafts.append(draft(tables, pipelines, f"CP-SAT allocation, cap {cap}"))

    if not templates:
        return [], False
    budget = max(options.time_limit_s * 0.5, 0.05)
    # The run over every template, without a cap, also gives its runners-up (on the
    # inputs measured, those of the other runs found no plan the grids did not).
    free = allocate(tables, templates, max_pipelines=None, time_limit_s=budget / 4,
                    num_workers=options.num_workers, runners_up=RUNNERS_UP)
    if free is None:
        return [], False
    add_drafts(free, templates, None)
    proven = free.proven
    num_free = sum(free.counts.values())
    # Caps on the pipeline count trade data parallelism for shorter sync rings; caps far
    # below the free optimum would leave most GPUs idle.
    caps: list[int | None] = [None]
    cap = 1
    while cap * 8 < num_free:
        cap *= 2
    while cap < num_free:
        caps.append(cap)
        cap *= 2
    # Runs of each sync threshold's rank form a chain, looser caps first: each starts from
    # the allocation of the one before it where that fits (on the inputs measured, tight caps
    # and sync subsets often end where a looser run did). The free run heads no chain: it
    # uses more pipelines than any cap allows.
    runs: list[tuple[int | None, list[PipelineTemplate], int | None]] = []
    last_of_rank: dict[int, int] = {}
    for cap_value in caps:
        subsets = _sync_filtered(templates, cap_value or num_free)
        for rank, subset in enumerate(subsets):
            if cap_value is None and len(subset) == len(templates):
                continue  # the free run, solved above
            runs.append((cap_value, subset, last_of_rank.get(len(subsets) - 1 - rank)))
            last_of_rank[len(subsets) - 1 - rank] = len(runs) - 1
    # A ring that spans zones runs at the slowest inter-zone link: the allocation's linear
    # model does not see it, and leaving a zone idle can be faster. These runs only look for
    # such plans; they prove nothing the runs over every template do not.
    proving = len(runs)
    # Of each confined set, its two tighter sync subsets: the whole set's run finds the
    # most compute, which is what confining gives up (on the inputs measured, leaving it
    # out lost no plan and a sixth of the allocation's time on six types).
    runs += [(None, subset, None) for confined in _confined_subsets(tables, templates)
             for subset in _sync_filtered(confined, num_free)[:2]]
    futures: list[Future[Allocation | None]] = []

    def solve(cap_value: int | None, subset: list[PipelineTemplate], after: int | None
              ) -> Allocation | None:
        if time.monotonic() - started > budget:
            raise TimeoutError
        return allocate(tables, subset, max_pipelines=cap_value,
                        time_limit_s=budget / (4 * len(caps)), num_workers=options.num_workers,
                        seed=_seed(subset, *ended_before(after)))

    def ended_before(after: int | None) -> tuple[list[PipelineTemplate], Allocation | None]:
        """The templates and allocation of the run a chained run starts from."""
        if after is None:
            return [], None
        try:  # submitted before this one: running or done, never waiting behind it
            return runs[after][1], futures[after].result()
        except TimeoutError:
            return [], None

    # Chains are independent and CP-SAT releases the GIL while it solves: solve them side
    # by side, and take their results in a fixed order, so the plan does not depend on timing.
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for run in runs:
            futures.append(pool.submit(solve, *run))
        try:
            for done, ((cap_value, subset, _), future) in enumerate(zip(runs, futures,
                                                                        strict=True)):
                # A progress callback may raise to cancel: report often enough for that.
                report(0.3 + 0.4 * done / len(runs),
                       f"allocating with at most {cap_value or num_free} pipelines")
                try:
                    found = future.result()
                except TimeoutError:
                    proven = proven and done >= proving
                    continue
                if found is not None:
                    proven = proven and (found.proven or done >= proving)
                    add_drafts(found, subset, cap_value)
        finally:
            for future in futures:
                future.cancel()
    return best_realized(tables, drafts, 2 * options.finalists), proven


def _seed(subset: list[PipelineTemplate], before: list[PipelineTemplate],
          found: Allocation | None) -> dict[int, int] | None:
    """`found` (an allocation over `before`) as counts over `subset`, where every template
    it uses is offered there."""
    if found is None:
        return None
    index = {id(t): k for k, t in enumerate(subset)}
    counts = {index.get(id(before[k]), -1): n for k, n in found.counts.items()}
    return None if -1 in counts else counts


MAX_ZONES_SUBSETS = 4
"""Up to this many zones, every proper subset of them gets its own allocation runs."""


def _confined_subsets(
    tables: ScenarioTables, templates: list[PipelineTemplate]
) -> list[list[PipelineTemplate]]:
    """Templates confined to each proper subset of the zones (with more zones, to each zone
    alone and to all but each one). A GPU type left idle is the grids' to find (all types
    but each one, `grids.py`): runs confined to all types but each one found no other plan
    on the inputs measured, for a fifth to a third of the allocation's time at 512 GPUs."""
    zones = sorted({c.zone or "" for c in tables.classes})
    picks: list[Callable[[ClassKey], bool]] = []
    if len(zones) >= 2:
        kept = ([set(c) for k in range(1, len(zones)) for c in itertools.combinations(zones, k)]
                if len(zones) <= MAX_ZONES_SUBSETS
                else [{z} for z in zones] + [set(zones) - {z} for z in zones])
        picks += [functools.partial(_in_zones, allowed) for allowed in kept]
    subsets = []
    for allowed in picks:
        subset = [t for t in templates if all(allowed(key) for key in t.gpus())]
        if subset:
            subsets.append(subset)
    return subsets


def _in_zones(zones: set[str], key: ClassKey) -> bool:
    return (key[1] or "") in zones


def _sync_filtered(
    templates: list[PipelineTemplate], num_pipelines: int
) -> list[list[PipelineTemplate]]:
    """Template subsets whose sync time stays under a few thresholds."""
    sync = [t.sync_s(num_pipelines) for t in templates]
    syncs = sorted({round(x, 6) for x in sync})
    if len(syncs) <= 1:
        return [templates]
    picks = sorted({syncs[int(q * (len(syncs) - 1))] for q in (0.3, 0.6, 1.0)})
    subsets = []
    for threshold in picks:
        subset = [t for t, x in zip(templates, sync, strict=True) if x <= threshold + 1e-9]
        if subset:
            subsets.append(subset)
    return subsets


Judged = list[tuple[Candidate, Evaluation | None]]
"""Candidates, best first by the quick estimate, with the estimator's verdict (None: not
judged, quoted too far above the best one judged before it)."""


def _judge_group(scenario: Scenario, group: list[Candidate], limit: int,
                 known: dict[int, Evaluation] | None = None) -> Judged:
    """Judge the `limit` candidates of least quick estimate, in that order."""
    judged: Judged = []
    best_s = math.inf
    for candidate in sorted(group, key=lambda c: c.quick_s)[:limit]:
        # The quick estimate is at most a few percent above the simulated time (it leaves
        # out pipeline bubbles): a finalist quoted far above the best so far cannot win.
        if candidate.quick_s > best_s * QUICK_SLACK:
            judged.append((candidate, None))
            continue
        evaluation = (known or {}).get(id(candidate)) or evaluate(scenario, candidate.plan)
        judged.append((candidate, evaluation))
        if evaluation.valid and evaluation.iteration_s is not None:
            best_s = min(best_s, evaluation.iteration_s)
    return judged


def _judged(scenario: Scenario, group: list[Candidate]) -> Judged:
    """A baseline's placed candidates, its best few judged by the estimator."""
    return (_judge_group(scenario, group, BASELINE_FINALISTS)
            + [(c, None) for c in sorted(group, key=lambda c: c.quick_s)[BASELINE_FINALISTS:]])


@dataclass(frozen=True)
class Beside:
    """What runs beside the search: the per-type baseline, judged, and the grids. From a
    forked child the candidates come unbuilt, as their templates and placements: the
    parent builds the plan of the few it reads (building and pickling every plan document
    took 0.07-0.1 s of the child's path at 512 GPUs, BENCHMARKS 3)."""

    per_type: Judged
    grids: list[Candidate]


def _beside(scenario: Scenario, tables: ScenarioTables) -> Beside:
    return Beside(per_type=_judged(scenario, per_type_candidates(tables)),
                  grids=grid_candidates(tables))


FORK_FROM_GPUS = 128
"""From this many GPUs, the per-type baseline runs in a forked child (when the process may fork):
below, it takes less time than a fork and the pickling of its candidates."""


def _share_of_time_so_far(started: float, options: SearchOptions, share: float,
                          least_s: float) -> float:
    """A deadline `share` of the search's time so far from now (at least `least_s`), never
    past the time limit."""
    now = time.monotonic()
    return min(started + options.time_limit_s, now + max(least_s, share * (now - started)))


def _worth_forking(tables: ScenarioTables) -> bool:
    return sum(c.num_gpus for c in tables.classes) >= FORK_FROM_GPUS


def _finalists(candidates: list[Candidate], families: list[list[Candidate]], limit: int
               ) -> list[Candidate]:
    """The `limit` candidates of least quick estimate, and the best FAMILY_FINALISTS of each
    family among them, least quick estimate first. The families' quick estimates err
    differently (a grid placed stage-major is quoted with its stages' transfers inside a
    node), and one family's optimistic quotes must not crowd out another's best."""
    chosen = {id(c): c for c in sorted(candidates, key=lambda c: c.quick_s)[:limit]}
    for family in families:
        for candidate in sorted(family, key=lambda c: c.quick_s)[:FAMILY_FINALISTS]:
            chosen.setdefault(id(candidate), candidate)
    return sorted(chosen.values(), key=lambda c: c.quick_s)


def _judge(
    scenario: Scenario,
    candidates: list[Candidate],
    families: list[list[Candidate]],
    baselines: dict[str, Judged],
    options: SearchOptions,
    admissible: Callable[[Plan], bool] | None,
    *,
    started: float,
    known: dict[int, Evaluation] | None = None,
) -> tuple[Candidate | None, Evaluation | None, dict[str, float | None],
           list[tuple[Candidate, Evaluation]]]:
    """The best valid plan (its batch shares and split then refined), each baseline's rate,
    and the runners-up, best first. `admissible` rules plans out beyond validity; `known`
    holds candidates' evaluations computed before."""
    known = dict(known or {})
    known.update((id(c), e) for group in baselines.values() for c, e in group if e is not None)
    chosen = _finalists(candidates, families, options.finalists)
    finalists = _judge_group(scenario, chosen, len(chosen), known)
    valid: list[tuple[float, Candidate, Evaluation]] = []
    seen: set[int] = set()
    for candidate, evaluation in finalists + [j for group in baselines.values() for j in group]:
        if evaluation is None or id(candidate) in seen:
            continue
        seen.add(id(candidate))
        if evaluation.valid and evaluation.iteration_s is not None and (
                admissible is None or admissible(candidate.plan)):
            valid.append((evaluation.iteration_s, candidate, evaluation))
    valid.sort(key=lambda v: v[0])
    for _, candidate, evaluation in valid[:REFINED]:
        balanced = rebalance(scenario, candidate.plan, evaluation)
        if balanced is None:
            continue
        again = evaluate(scenario, balanced)
        if again.valid and again.iteration_s is not None:
            valid.append((again.iteration_s, Candidate.of(
                balanced, quick_s=again.iteration_s,
                origin=f"{candidate.origin}, exact batch shares"), again))
    best: Candidate | None = None
    best_eval: Evaluation | None = None
    if valid:
        _, best, best_eval = min(valid, key=lambda v: v[0])
        # Each try evaluates the whole plan: never more than a share of the time so far.
        polished = polish_plan(
            scenario, best.plan, best_eval,
            deadline=_share_of_time_so_far(started, options, POLISH_SHARE, POLISH_MIN_S))
        if polished is not None:
            best = Candidate.of(polished[0], quick_s=polished[1].iteration_s or best.quick_s,
                                origin=f"{best.origin}, polished by simulation")
            best_eval = polished[1]
    # A baseline's rate counts its candidates judged among the finalists too.
    known.update((id(c), e) for c, e in finalists if e is not None)
    rates: dict[str, float | None] = {}
    for name, group in baselines.items():
        values = [e.samples_per_s for c, _ in group
                  if (e := known.get(id(c))) is not None and e.valid and e.samples_per_s is not None]
        rates[name] = max(values, default=None)
    valid.sort(key=lambda v: v[0])
    return best, best_eval, rates, [(c, e) for _, c, e in valid]


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
