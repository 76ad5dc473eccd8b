"""How many pipelines of each template to run: a CP-SAT model over GPU counts.

With `x_k` pipelines of template k, a pipeline finishing by time T processes
about `b_k * (1 + (T - fill_k) / bottleneck_k)` samples: linear in T. The
least T at which the chosen pipelines cover the global batch is a ratio of two
linear forms of x, minimised by Dinkelbach's iteration: each step maximises
the samples covered at the current T, a multi-dimensional knapsack over GPU
classes that CP-SAT solves under a time limit, seeded with a greedy solution.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp

from planner.search.tables import ScenarioTables
from planner.search.templates import PipelineTemplate, StageShape

__all__ = ["RUNNERS_UP", "Allocation", "allocate", "prune", "pareto"]

SCALE = 1000.0  # CP-SAT works in integers: samples are scaled to thousandths
MODEL_TEMPLATES = 80  # templates offered to one knapsack
DINKELBACH_STEPS = 2
"""Knapsacks per allocation. Each search runs a dozen allocations (caps, sync subsets);
a third step changed no plan on the benchmark scenarios."""
RUNNERS_UP = 2
"""Allocations after the best, each with one more template banned, where the search asks
for them."""
RUNNER_UP_STEPS = 1
"""Knapsacks per runner-up: their allocations are drafts, not the proven optimum."""


@dataclass(frozen=True, kw_only=True)
class Allocation:
    counts: dict[int, int]
    """Template index -> number of pipelines."""
    pipeline_s: float
    """Estimated time of the slowest pipeline."""
    proven: bool
    """Every knapsack step was solved to optimality and the iteration converged."""
    visited: tuple[dict[int, int], ...] = ()
    """Every allocation met on the way (greedy seed, each step): more drafts for the
    estimator, whose sync and placement the linear model does not see."""


def _capacity(t: PipelineTemplate) -> tuple[float, float]:
    """(slope, intercept) of samples covered by one pipeline at time T."""
    slope = t.micro_batch / t.bottleneck_s
    return slope, t.micro_batch * (1.0 - t.fill_s / t.bottleneck_s)


class _Offer:
    """The templates of one allocation as arrays: every knapsack step ranks all of them."""

    def __init__(self, templates: Sequence[PipelineTemplate]) -> None:
        capacity = [_capacity(t) for t in templates]
        self.slope = np.array([c[0] for c in capacity])
        self.intercept = np.array([c[1] for c in capacity])
        self.fill = np.array([t.fill_s for t in templates])
        self.gpus = np.array([t.num_gpus for t in templates])


def allocate(
    tables: ScenarioTables,
    templates: Sequence[PipelineTemplate],
    *,
    max_pipelines: int | None,
    time_limit_s: float,
    num_workers: int = 1,
    runners_up: int = 0,
    seed: dict[int, int] | None = None,
) -> Allocation | None:
    """Pipelines per template that cover the global batch soonest, within GPU limits. With
    `runners_up`, that many more iterations each ban one more template: the one holding
    the most GPUs in the allocation before (their allocations are only `visited`). Many
    allocations lie within a fraction of a percent of each other in the linear model,
    which sees neither the sync rings nor placement: which of them the knapsack returns
    is chance, and the estimator may rank another first. A `seed` (pipelines per template
    index, say another run's allocation) starts the iteration where it fits and covers the
    batch sooner than the greedy allocation: a knapsack step fewer where it is the optimum."""
    deadline = time.monotonic() + time_limit_s
    usage = _usage_table(tables, templates)
    offer = _Offer(templates)
    best = _iterate(tables, templates, offer, usage, max_pipelines, deadline, num_workers,
                    banned=set(), seed=seed)
    if best is None:
        return None
    visited = list(best.visited)
    banned: set[int] = set()
    latest = best.counts
    for _ in range(runners_up):
        banned.add(max(latest, key=lambda k: (latest[k] * templates[k].num_gpus, -k)))
        other = _iterate(tables, templates, offer, usage, max_pipelines, deadline, num_workers,
                         banned=banned, steps=RUNNER_UP_STEPS)
        if other is None:
            break
        visited += other.visited
        latest = other.counts
    return dataclasses.replace(best, visited=tuple(visited))


def _iterate(
    tables: ScenarioTables,
    templates: Sequence[PipelineTemplate],
    offer: _Offer,
    usage: dict[int, dict[Row, int]],
    max_pipelines: int | None,
    deadline: float,
    num_workers: int,
    *,
    banned: set[int],
    steps: int = DINKELBACH_STEPS,
    seed: dict[int, int] | None = None,
) -> Allocation | None:
    """Dinkelbach's iteration from the greedy allocation (or the seed, where it fits and
    finishes sooner), without the `banned` templates."""
    batch = tables.scenario.job.global_batch_size
    counts = _greedy(tables, offer, usage, max_pipelines, banned)
    if not counts:
        return None
    target = _finish_time(templates, counts, batch)
    visited = [counts]
    if seed and _fits(tables, usage, seed, max_pipelines, banned):
        seeded = _finish_time(templates, seed, batch)
        if seeded < target:
            counts, target = seed, seeded
            visited.append(seed)
    proven, converged = True, False
    for _ in range(steps):
        remaining = deadline - time.monotonic()
        if remaining <= 0.01:
            break
        solved, optimal = _knapsack(tables, templates, offer, usage, target, counts,
                                    max_pipelines, remaining, num_workers, banned)
        proven = proven and optimal
        if not solved:
            break
        visited.append(solved)
        new_target = _finish_time(templates, solved, batch)
        if new_target >= target * (1 - 1e-6):
            converged = True  # no allocation covers the batch sooner: the ratio's optimum
            break
        counts, target = solved, new_target
    return Allocation(counts=counts, pipeline_s=target, proven=proven and converged,
                      visited=tuple(visited))


def _fits(tables: ScenarioTables, usage: dict[int, dict[Row, int]], counts: dict[int, int],
          max_pipelines: int | None, banned: set[int]) -> bool:
    """Whether an allocation fits the GPUs, the cap on pipelines and the bans."""
    if banned & counts.keys() or (max_pipelines is not None
                                  and sum(counts.values()) > max_pipelines):
        return False
    used: dict[Row, int] = {}
    for k, n in counts.items():
        for row, amount in usage[k].items():
            used[row] = used.get(row, 0) + n * amount
    rows = tables.resource_rows
    return all(amount <= rows[row] for row, amount in used.items())


def _finish_time(templates: Sequence[PipelineTemplate], counts: dict[int, int], batch: int) -> float:
    """T with sum_k x_k * (slope_k * T + intercept_k) = batch, at least every fill time."""
    slope = sum(n * _capacity(templates[k])[0] for k, n in counts.items())
    intercept = sum(n * _capacity(templates[k])[1] for k, n in counts.items())
    if slope <= 0:
        return math.inf
    longest_fill = max(templates[k].fill_s for k in counts)
    return max((batch - intercept) / slope, longest_fill)


Row = tuple[tuple[str, str | None], int]


def _usage_table(
    tables: ScenarioTables, templates: Sequence[PipelineTemplate]
) -> dict[int, dict[Row, int]]:
    """Per template, its non-zero GPU usage of each (class, tp level) row."""
    levels = tables.resource_levels
    return {k: t.usage(levels) for k, t in enumerate(templates)}


def prune(templates: Sequence[PipelineTemplate], keep: int = 3) -> list[PipelineTemplate]:
    """Of templates using exactly the same GPUs, keep the few with the best throughput."""
    groups: dict[frozenset[tuple[StageShape, int]], list[PipelineTemplate]] = {}
    for t in templates:
        groups.setdefault(frozenset(t.stage_counts.items()), []).append(t)
    kept = []
    for group in groups.values():
        group.sort(key=lambda t: (t.bottleneck_s / t.micro_batch, t.fill_s / t.micro_batch))
        kept.extend(group[:keep])
    return kept


def _greedy(
    tables: ScenarioTables,
    offer: _Offer,
    usage: dict[int, dict[tuple[tuple[str, str | None], int], int]],
    max_pipelines: int | None,
    banned: set[int],
) -> dict[int, int]:
    """Fill GPUs with the templates of best throughput per GPU: the solver's hint."""
    rows = tables.resource_rows
    free = dict(rows)
    order = np.argsort(-offer.slope / offer.gpus, kind="stable")  # samples/s per GPU
    counts: dict[int, int] = {}
    total = 0
    for k in order.tolist():
        if k in banned:
            continue
        need = usage[k]
        while max_pipelines is None or total < max_pipelines:
            if any(need[row] > free[row] for row in need):
                break
            for row in need:
                free[row] -= need[row]
            counts[k] = counts.get(k, 0) + 1
            total += 1
    return counts


def _knapsack(
    tables: ScenarioTables,
    templates: Sequence[PipelineTemplate],
    offer: _Offer,
    usage: dict[int, dict[tuple[tuple[str, str | None], int], int]],
    target_s: float,
    hint: dict[int, int],
    max_pipelines: int | None,
    time_limit_s: float,
    num_workers: int,
    banned: set[int],
) -> tuple[dict[int, int] | None, bool]:
    """Maximise samples covered by time `target_s`; (counts, proven optimal)."""
    # Data: value of one pipeline of each template at the target time; the knapsack keeps the
    # templates of most value per GPU (an optimum uses few distinct ones) and the hint's.
    covered = offer.slope * target_s + offer.intercept
    useful = (covered > 0) & (offer.fill <= target_s)
    useful[list(banned)] = False
    candidates = np.flatnonzero(useful)
    ranked = candidates[np.argsort(-covered[candidates] / offer.gpus[candidates], kind="stable")]
    value = {k: round(float(covered[k]) * SCALE)
             for k in {*ranked[:MODEL_TEMPLATES].tolist(), *hint} if useful[k]}
    if not value:
        return None, False
    rows = tables.resource_rows
    # CP-SAT through OR-Tools' linear-solver wrapper: the same solver, without the half
    # second that loading its own Python layer costs every fresh process.
    solver = pywraplp.Solver.CreateSolver("CP-SAT")
    infinity = solver.infinity()
    # Variables: pipelines per useful template.
    sizes = {c.key: c.num_gpus for c in tables.classes}
    count = {k: solver.IntVar(0, _upper_bound(sizes, templates[k]), f"count[{k}]") for k in value}
    # Constraints: stages of at least each tp level fit the GPUs that can host them.
    for row, capacity in rows.items():
        terms = [(usage[k][row], var) for k, var in count.items() if row in usage[k]]
        if terms:
            fit = solver.Constraint(-infinity, capacity)
            for used, var in terms:
                fit.SetCoefficient(var, used)
    # The number of pipelines, which sets the sync ring's length, may be capped.
    total = solver.Constraint(1, max_pipelines if max_pipelines is not None else infinity)
    for var in count.values():
        total.SetCoefficient(var, 1)
    # Objective: samples covered by the target time.
    objective = solver.Objective()
    for k, var in count.items():
        objective.SetCoefficient(var, value[k])
    objective.SetMaximization()
    solver.SetHint(list(count.values()), [float(hint.get(k, 0)) for k in count])
    # A knapsack step within 0.1% of its optimum moves Dinkelbach's iteration as well. A
    # model of under a hundred variables gains nothing from presolve, probing or symmetry
    # detection: without them a search's 26 knapsacks took 0.16 s, not 0.27 s (six-type
    # 512-GPU input, BENCHMARKS 3), to the same objective but one within the gap.
    solver.SetSolverSpecificParametersAsString(
        "cp_model_presolve:false cp_model_probing_level:0 symmetry_level:0 "
        f"num_workers:{num_workers} random_seed:0 relative_gap_limit:0.001 "
        f"max_time_in_seconds:{max(time_limit_s, 0.01):.3f}")
    status = solver.Solve()
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return None, False
    counts = {k: round(var.solution_value()) for k, var in count.items()
              if round(var.solution_value()) > 0}
    found, bound = objective.Value(), objective.BestBound()
    gap = abs(found - bound) / max(1.0, abs(found))
    return counts, status == pywraplp.Solver.OPTIMAL and gap <= 1e-3


def _upper_bound(sizes: dict[tuple[str, str | None], int], t: PipelineTemplate) -> int:
    return min(sizes[key] // used for key, used in t.gpus().items())


def pareto(templates: Sequence[PipelineTemplate], classes: Sequence[tuple[str, str | None]],
           num_pipelines: int) -> list[PipelineTemplate]:
    """Drop templates another one of the same micro-batch size beats on every count: GPUs
    of each class, rate, fill and sync."""
    by_size: dict[int, list[PipelineTemplate]] = {}
    for t in templates:
        by_size.setdefault(t.micro_batch, []).append(t)
    kept: list[PipelineTemplate] = []
    for group in by_size.values():
        kept.extend(_pareto_group(group, classes, num_pipelines))
    return kept


def _pareto_group(templates: Sequence[PipelineTemplate], classes: Sequence[tuple[str, str | None]],
                  num_pipelines: int) -> list[PipelineTemplate]:
    if len(templates) < 2:
        return list(templates)
    index = {key: i for i, key in enumerate(classes)}
    usage = np.zeros((len(templates), len(classes)))
    for k, t in enumerate(templates):
        for key, used in t.gpus().items():
            usage[k, index[key]] = used
    rate = np.array([t.micro_batch / t.bottleneck_s for t in templates])
    fill = np.array([t.fill_s for t in templates])
    sync = np.array([t.sync_s(num_pipelines) for t in templates])
    # Only a template using a subset of the same classes can dominate: compare each group
    # of templates with one class set against the templates of its subsets.
    uses = usage > 0
    sets: dict[tuple[bool, ...], list[int]] = {}
    for k in range(len(templates)):
        sets.setdefault(tuple(uses[k]), []).append(k)
    keep = np.ones(len(templates), dtype=bool)
    for own_set, members in sets.items():
        own = np.array(members)
        rivals = np.concatenate([np.array(ks) for other, ks in sets.items()
                                 if all(o or not x for o, x in zip(own_set, other, strict=True))])
        # Both sides use no class outside the own set: only its columns can differ.
        columns = np.flatnonzero(own_set)
        rival_usage = usage[rivals][:, columns]
        for start in range(0, len(own), 256):
            part = own[start:start + 256]
            part_usage = usage[part][:, columns]
            no_worse = ((rival_usage[None, :, :] <= part_usage[:, None, :]).all(axis=2)
                        & (rate[None, rivals] >= rate[part, None])
                        & (fill[None, rivals] <= fill[part, None])
                        & (sync[None, rivals] <= sync[part, None]))
            better = ((rival_usage[None, :, :] < part_usage[:, None, :]).any(axis=2)
                      | (rate[None, rivals] > rate[part, None]) | (fill[None, rivals] < fill[part, None])
                      | (sync[None, rivals] < sync[part, None]))
            keep[part] = ~(no_worse & better).any(axis=1)
    return [t for t, k in zip(templates, keep, strict=True) if k]
