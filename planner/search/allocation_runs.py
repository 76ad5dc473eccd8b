"""The allocation's runs: CP-SAT over the templates without a cap on the pipeline count,
then under caps (fewer pipelines, shorter sync rings) and over subsets of the templates
whose sync stays under a few thresholds or inside some zones. Each allocation found, and
those Dinkelbach's iteration visited on the way, becomes a placed draft (`drafts.py`)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.search.allocate import RUNNERS_UP, Allocation, allocate
from planner.search.drafts import Candidate, Draft, best_realized, draft
from planner.search.tables import ScenarioTables
from planner.search.templates import ClassKey, PipelineTemplate

__all__ = ["allocation_candidates"]


def allocation_candidates(
    tables: ScenarioTables,
    templates: list[PipelineTemplate],
    *,
    time_limit_s: float,
    num_workers: int,
    finalists: int,
    started: float,
    report: Callable[[float, str], None],
    threads: int,
) -> tuple[list[Candidate], bool]:
    """Placed drafts of the allocations found over `templates` (best `2 * finalists`), and
    whether every run over all of them was proven within its own model. At most half the
    time limit from `started` goes to these runs; `threads` chains are solved at once."""
    if not templates:
        return [], False
    budget = max(time_limit_s * 0.5, 0.05)
    book = _DraftBook(tables)
    # The run over every template, without a cap, also gives its runners-up (on the
    # inputs measured, those of the other runs found no plan the grids did not).
    free = allocate(tables, templates, max_pipelines=None, time_limit_s=budget / 4,
                    num_workers=num_workers, runners_up=RUNNERS_UP)
    if free is None:
        return [], False
    book.add(free, templates, None)
    num_free = sum(free.counts.values())
    caps = _pipeline_caps(num_free)
    runs, proving = _planned_runs(tables, templates, caps, num_free)
    chains = _Chains(tables=tables, runs=runs, started=started, budget_s=budget,
                     run_limit_s=budget / (4 * len(caps)), num_workers=num_workers,
                     num_free=num_free)
    runs_proven = chains.solve_all(book, threads=threads, proving=proving, report=report)
    return best_realized(tables, book.drafts, 2 * finalists), free.proven and runs_proven


class _DraftBook:
    """A draft of every allocation met, each once: caps and subsets often lead to the same
    allocation."""

    def __init__(self, tables: ScenarioTables) -> None:
        self.tables = tables
        self.drafts: list[Draft | None] = []
        self._seen: set[tuple[tuple[int, int], ...]] = set()

    def add(self, found: Allocation, subset: list[PipelineTemplate], cap: int | None,
            note: str = "") -> None:
        """Every allocation `found` visited (counts over `subset`) not met before."""
        for counts in found.visited:
            key = tuple(sorted((id(subset[k]), n) for k, n in counts.items()))
            if key in self._seen:
                continue
            self._seen.add(key)
            pipelines = [subset[k] for k, n in sorted(counts.items()) for _ in range(n)]
            self.drafts.append(draft(self.tables, pipelines, f"CP-SAT allocation, cap {cap}{note}"))


def _pipeline_caps(num_free: int) -> list[int | None]:
    """No cap, then caps on the pipeline count, powers of two below the free run's count
    `num_free`: they trade data parallelism for shorter sync rings, and caps far below the
    free optimum (an eighth of it or less) would leave most GPUs idle."""
    caps: list[int | None] = [None]
    cap = 1
    while cap * 8 < num_free:
        cap *= 2
    while cap < num_free:
        caps.append(cap)
        cap *= 2
    return caps


def _planned_runs(tables: ScenarioTables, templates: list[PipelineTemplate],
                  caps: list[int | None], num_free: int) -> tuple[list[_Run], int]:
    """The runs after the free one, and how many of them, the first, bear on whether the
    allocation is proven (the rest only look for plans)."""
    # Runs of each sync threshold's rank form a chain, looser caps first: each starts from
    # the allocation of the one before it where that fits (on the inputs measured, tight caps
    # and sync subsets often end where a looser run did). The free run heads no chain: it
    # uses more pipelines than any cap allows.
    runs: list[_Run] = []
    last_of_rank: dict[int, int] = {}
    for cap_value in caps:
        subsets = _sync_filtered(templates, cap_value or num_free)
        for rank, (threshold, subset) in enumerate(subsets):
            if cap_value is None and len(subset) == len(templates):
                continue  # the free run, solved already
            runs.append(_Run(cap=cap_value, subset=subset, threshold=threshold,
                             offered=templates, after=last_of_rank.get(len(subsets) - 1 - rank)))
            last_of_rank[len(subsets) - 1 - rank] = len(runs) - 1
    # A ring that spans zones runs at the slowest inter-zone link: the allocation's linear
    # model does not see it, and leaving a zone idle can be faster. These runs only look for
    # such plans; they prove nothing the runs over every template do not.
    proving = len(runs)
    # Of each confined set, its two tighter sync subsets: the whole set's run finds the
    # most compute, which is what confining gives up (on the inputs measured, leaving it
    # out lost no plan and a sixth of the allocation's time on six types). Capped, the
    # whole set is run too: fewer pipelines on one zone's GPUs can beat any plan whose
    # rings cross zones (a held-out two-zone input: 187 against 175 samples/s), and the
    # tighter subsets at each cap added no plan for their time.
    confined_sets = _confined_subsets(tables, templates)
    runs += [_Run(cap=None, subset=subset, threshold=threshold, offered=confined, after=None)
             for confined in confined_sets
             for threshold, subset in _sync_filtered(confined, num_free)[:2]]
    runs += [_Run(cap=cap_value, subset=confined, threshold=None, offered=confined, after=None)
             for confined in confined_sets for cap_value in caps[1:]]
    return runs, proving


@dataclass(kw_only=True)
class _Chains:
    """The runs after the free one, solved side by side: chains, not runs, are independent
    (each chained run starts from the allocation the run before it ended at), and CP-SAT
    releases the GIL while it solves. Results are taken in a fixed order, so the plan does
    not depend on timing."""

    tables: ScenarioTables
    runs: list[_Run]
    started: float
    budget_s: float
    """Seconds from `started` after which no run starts another allocation."""
    run_limit_s: float
    """Each allocation's own time limit."""
    num_workers: int
    num_free: int
    """Pipelines of the free run: the count a run without a cap is set for."""
    _futures: list[Future[list[_Found]]] = field(default_factory=list, init=False)

    def solve_all(self, book: _DraftBook, *, threads: int, proving: int,
                  report: Callable[[float, str], None]) -> bool:
        """Every run's allocations into `book`; whether the first `proving` runs were all
        proven (a run out of time proves nothing)."""
        proven = True
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for run in self.runs:
                self._futures.append(pool.submit(self._solve, run))
            try:
                for done, (run, future) in enumerate(zip(self.runs, self._futures, strict=True)):
                    # A progress callback may raise to cancel: report often enough for that.
                    report(0.3 + 0.4 * done / len(self.runs),
                           f"allocating with at most {run.cap or self.num_free} pipelines")
                    try:
                        found = future.result()
                    except TimeoutError:
                        proven = proven and done >= proving
                        continue
                    if found:
                        proven = proven and (found[0].allocation.proven or done >= proving)
                    for allocation, subset, at in found:
                        book.add(allocation, subset, run.cap, "" if at is None else (
                            f", sync threshold at {at} pipelines"))
            finally:
                for future in self._futures:
                    future.cancel()
        return proven

    def _solve(self, run: _Run) -> list[_Found]:
        """The run's allocation, then, where it uses fewer pipelines than its threshold was
        set for, the allocation over the templates whose rings stay under the threshold at
        the count it uses (started from the first)."""
        found: list[_Found] = []
        subset, seed = run.subset, _seed(run.subset, *self._ended_before(run.after))
        num_pipelines = run.cap or self.num_free
        at: int | None = None
        for _ in range(2):
            if time.monotonic() - self.started > self.budget_s:
                if found:
                    break
                raise TimeoutError
            allocation = allocate(self.tables, subset, max_pipelines=run.cap,
                                  time_limit_s=self.run_limit_s,
                                  num_workers=self.num_workers, seed=seed)
            if allocation is None:
                break
            if found:
                # Only an allocation the linear model finds faster: the drafts met on the
                # way would push others out of the finalists for nothing.
                if allocation.pipeline_s >= found[0].allocation.pipeline_s * (1 - 1e-9):
                    break
                allocation = dataclasses.replace(allocation, visited=(allocation.counts,))
            found.append(_Found(allocation, subset, at))
            used = sum(allocation.counts.values())
            if used >= num_pipelines or run.threshold is None:
                break
            # Rings are shorter among fewer pipelines: templates filtered out at the count
            # the threshold was set for may fit under it at the count actually used.
            wider = [t for t in run.offered if t.sync_s(used) <= run.threshold + 1e-9]
            if len(wider) <= len(subset):
                break
            seed = _seed(wider, subset, allocation)
            subset, num_pipelines, at = wider, used, used
        return found

    def _ended_before(self, after: int | None
                      ) -> tuple[list[PipelineTemplate], Allocation | None]:
        """The templates and allocation of the run a chained run starts from."""
        if after is None:
            return [], None
        try:  # submitted before this one: running or done, never waiting behind it
            found = self._futures[after].result()
        except TimeoutError:
            return [], None
        return (found[-1].subset, found[-1].allocation) if found else ([], None)


@dataclass(frozen=True, kw_only=True)
class _Run:
    """One allocation run: its cap on pipelines, its templates, the sync threshold that
    chose them (None: every template) among those `offered`, and the run whose allocation
    it starts from."""

    cap: int | None
    subset: list[PipelineTemplate]
    threshold: float | None
    offered: list[PipelineTemplate]
    after: int | None


class _Found(NamedTuple):
    allocation: Allocation
    subset: list[PipelineTemplate]
    at: int | None
    """The pipeline count its sync threshold was applied at, where not the run's own."""


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
) -> list[tuple[float | None, list[PipelineTemplate]]]:
    """Template subsets whose sync time among `num_pipelines` stays under a few thresholds,
    each with its threshold (None: a single subset of every template)."""
    sync = [t.sync_s(num_pipelines) for t in templates]
    syncs = sorted({round(x, 6) for x in sync})
    if len(syncs) <= 1:
        return [(None, templates)]
    picks = sorted({syncs[int(q * (len(syncs) - 1))] for q in (0.3, 0.6, 1.0)})
    subsets: list[tuple[float | None, list[PipelineTemplate]]] = []
    for threshold in picks:
        subset = [t for t, x in zip(templates, sync, strict=True) if x <= threshold + 1e-9]
        if subset:
            subsets.append((threshold, subset))
    return subsets
