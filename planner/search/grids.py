"""Identical pipelines over several GPU classes: the grid a careful engineer lays over a
mixed fleet.

With a launcher that runs identical replicas, an engineer gives every replica an equal
share of each class: n replicas, each with slots_c / n stages of class c in a row (at the
class's tp), the classes in some order, the layers split by speed. The `unaware` baseline
has this shape with an even split, and the two-segment templates have two classes with
tails of a few sizes; here every class of a subset is in each replica: all classes and,
with three or more, all but one (a slow type left idle). Each class runs at one of three
tp: those its fastest homogeneous pipelines use at the micro-batch size, then those of least
compute per sample (where its pipelines fit at fewer tp, or at none), for every replica
count that splits every class evenly and leaves each replica a micro-batch (the shares of
the batch differing by one micro-batch where the count does not divide it: counts dividing
the batch alone were few on large fleets, none at 4,080 GPUs of the benchmark inputs).

Those structures are many (subsets x micro-batch sizes x tp per class x counts, then
orders of the classes), and each needs a layer DP: each is first estimated in closed form
(stages balanced by speed, their transfers, the fill, the sync ring of each class's
stages) and only the most promising are swept, in every order of their classes (the two
by memory with four or more). Placed stage-major, each stage of the n replicas shares a
node, its sync ring inside it: the placement step tries both ways, as for every draft.
The grids run beside the search, after the per-type baseline, whose every-depth
homogeneous pipelines rank each class's tp.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from planner.costs import state_bytes_per_param
from planner.documents import Schedule
from planner.search.drafts import Candidate, best_realized, replicas_draft
from planner.search.partition import SuffixSweep
from planner.search.per_type import SHARDED_OVER
from planner.search.tables import ResourceClass, ScenarioTables
from planner.search.templates import (
    ClassKey,
    PipelineTemplate,
    StageShape,
    TemplateContext,
    homogeneous_templates,
    template_from_partition,
)

__all__ = ["grid_candidates"]

SWEPT = 3
"""Structures of least estimated time swept by the layer DP, per subset of classes, at
least; more while their DP cells stay within SWEPT_CELLS."""
SWEPT_CELLS = 32768
"""Layers times stages times class orders that the sweeps of one subset may cover beyond
the first SWEPT structures, on fleets of up to SWEPT_CELLS_FULL_UP_TO GPUs. The closed-form
estimate balances stages, which with few micro-batches misranks the unbalanced splits that
win there, and sees neither memory nor transfers exactly: where sweeps are cheap (few
layers, shallow replicas) more structures are swept (on 8 layers and 8 GPUs the winner was
12th of 42); on deep models few or none."""
SWEPT_CELLS_FULL_UP_TO = 256
"""Past this many GPUs, SWEPT_CELLS_LARGE_FLEET instead: there the grids are built on the
path of the forked child that the search waits for, and planning time has its targets at
512 GPUs and more (32,768 cells cost the child 0.04-0.12 s there, and 8,192 up to 0.09 s on
the 130-layer input, which made it the longer path)."""
SWEPT_CELLS_LARGE_FLEET = 2048
BEYOND_CELLS_LARGE_FLEET = 8192
"""Past SWEPT_CELLS_LARGE_FLEET, structures are still swept up to this many cells on large
fleets, and the KEPT_BEYOND of least rough time among their drafts are placed beside the
KEPT of the first ones. The closed form misranks structures of many replicas: on a
perturbed 448-GPU input the best grid was 16th of its subset, out of reach of 2,048 cells,
and the input's quarter planned and laid down four times was 4.9% faster than the plan.
On 240 perturbed inputs at four times their size, ten plans faster (up to 8.7%). Kept
apart, as a family of their own among the search's finalists, because the quick estimates
misrank them too: taken together, the new ones crowded out drafts that placed better (two
plans 0.6-1.5% slower). They get no least-time split: the same plans there, and at 512
GPUs 1-8% more planning time than without the second lot instead of 3-14% (BENCHMARKS 3)."""
KEPT = 6
"""Grid drafts, least rough time first, placed and offered to the search."""
KEPT_BEYOND = 3
TP_PER_CLASS = 3
"""tp options per class and micro-batch size, fastest per GPU first. A third one lets a
class trade some speed per GPU for fewer, larger stages (on a perturbed 32-GPU LLaMA-7B
input, two A10 tp4 stages in front of four H100 tp2 ones: 2.5% faster than the best grid
with two options; no plan of the shared scenarios changed)."""
CORRECTED_FIRST = 64
"""Structures whose whole-layer estimate `_least` computes at once, in order of their
balanced estimate; each further batch twice the last (most callers take a few)."""
BISECTIONS = 40
"""Halvings of the interval searched for a structure's whole-layer bottleneck: 2^-40 of it."""
MAX_ORDERS_FROM = 4
"""With this many classes or more, two orders are swept (by memory, both ways), not all."""


@dataclass(frozen=True, kw_only=True)
class _Grid:
    classes: tuple[ResourceClass, ...]
    micro_batch: int
    tp: tuple[int, ...]
    replicas: int
    stages: tuple[int, ...]
    """Stages of each class in one replica."""


def grid_candidates(tables: ScenarioTables) -> list[list[Candidate]]:
    """Placed grids, one family per sweep budget (one, or two on large fleets), each best
    first by the quick estimate. Each class's homogeneous pipelines of every depth rank its
    tp (swept once per search: free after the per-type baseline)."""
    if len(tables.classes) < 2:
        return []
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    # Under ZeRO, state sharded over replicas fits at lower tp: the per-type baseline's
    # pipelines sized for several count too.
    hints = (1, SHARDED_OVER) if tables.scenario.job.zero_stage >= 1 else (1,)
    templates = [t for cls in tables.classes for hint in hints
                 for t in homogeneous_templates(ctx, cls, num_pipelines=hint)]
    best_tp = _best_tp(tables, templates)
    # State bytes per parameter by replica count (ZeRO shards it): read by every subset
    # and micro-batch size, for counts up to the most stages any class hosts.
    most = max(c.slots(1) for c in tables.classes)
    per_param = np.array([state_bytes_per_param(tables.scenario, n).total
                          for n in range(1, most + 1)])
    gpus = sum(c.num_gpus for c in tables.classes)
    budgets = ((SWEPT_CELLS, KEPT),) if gpus <= SWEPT_CELLS_FULL_UP_TO else (
        (SWEPT_CELLS_LARGE_FLEET, KEPT), (BEYOND_CELLS_LARGE_FLEET, KEPT_BEYOND))
    swept = [found for subset in _subsets(tables)
             for found in _swept_within(ctx, _least(ctx, subset, best_tp, per_param),
                                        [cells for cells, _ in budgets])]
    families = []
    for lot, (_, kept) in enumerate(budgets):
        drafts = (replicas_draft(tables, template, grid.replicas, "identical pipelines through "
                                 + ", ".join(dict.fromkeys(s.gpu_type for s in template.stages)))
                  for within, grid, template in swept if within == lot)
        families.append(best_realized(tables, drafts, kept))
    return families


def _best_tp(tables: ScenarioTables, templates: Sequence[PipelineTemplate]
             ) -> dict[tuple[ClassKey, int], list[int]]:
    """Per class and micro-batch size, the tp of its fastest homogeneous pipelines per GPU,
    then those of least compute per sample. A class too small or too memory-poor to hold
    the model alone at some tp (or at any) may still hold a grid's few layers there: the
    T4s of a perturbed GPT-2.7B input fit homogeneous pipelines at micro-batch 2 only at tp
    4 (a deep pipeline's first stages hold many micro-batches' activations), yet the best
    grid ends in a T4 at tp 1; offered tp 4 alone, its 320-GPU plan was 8% slower than its
    80-GPU quarter's laid down four times."""
    by_pipeline: dict[tuple[ClassKey, int], dict[int, float]] = {}
    for t in templates:
        shapes = set(t.stages)
        if len(shapes) == 1:
            (shape,) = shapes
            known = by_pipeline.setdefault((shape.resource, t.micro_batch), {})
            known[shape.tp] = max(t.micro_batch / t.bottleneck_s / t.num_gpus,
                                  known.get(shape.tp, 0.0))
    by_compute: dict[tuple[ClassKey, int], dict[int, float]] = {}
    for cls in tables.classes:
        for (gpu_type, b, tp), point in tables.points.items():
            if gpu_type == cls.gpu_type and tp <= cls.largest_node:
                by_compute.setdefault((cls.key, b), {})[tp] = b / (tp * float(point.compute_s[-1]))
    best = {}
    for key, rates in by_compute.items():
        pipelines = by_pipeline.get(key, {})
        ranked = (sorted(pipelines, key=lambda tp: (-pipelines[tp], tp))
                  + sorted((tp for tp in rates if tp not in pipelines),
                           key=lambda tp: (-rates[tp], tp)))
        best[key] = ranked[:TP_PER_CLASS]
    return best


def _subsets(tables: ScenarioTables) -> list[tuple[ResourceClass, ...]]:
    """All classes and, with three or more, all but each one."""
    classes = tables.classes
    if len(classes) < 3:
        return [classes]
    return [classes] + [tuple(c for c in classes if c is not left) for left in classes]


def _swept_within(ctx: TemplateContext, ranked: Iterator[_Grid], budgets: Sequence[float]
                  ) -> Iterator[tuple[int, _Grid, PipelineTemplate]]:
    """The pipelines of the first SWEPT structures of `ranked` that give any, passing over
    fewer than SWEPT that give none (a structure the closed form let through may not fit in
    memory once split), then of more while their sweeps cover at most `budgets[-1]` cells
    (layers x stages x orders of the classes), each with the index of the first budget
    its sweep is within (past the first, without least-time splits). On thousands of GPUs
    most structures ranked first may not fit: passing over every one of them tripled the
    grids' time at 8,192."""
    kept = failed = 0
    cells = 0
    for grid in ranked:
        if kept >= SWEPT or failed >= SWEPT:
            cells += ctx.tables.num_layers * sum(grid.stages) * len(_class_orders(ctx.tables,
                                                                               grid))
            if cells > budgets[-1]:
                return
        within = next(i for i, most in enumerate(budgets) if cells <= most)
        found = list(_swept(ctx, grid, least_time=within == 0))
        kept += bool(found)
        failed += not found
        yield from ((within, grid, template) for template in found)


def _least(ctx: TemplateContext, subset: tuple[ResourceClass, ...],
           best_tp: dict[tuple[ClassKey, int], list[int]], per_param: np.ndarray
           ) -> Iterator[_Grid]:
    """The grids of `subset`, least estimated iteration first: every micro-batch size, tp
    per class among its best, and replica count n that splits every class's stages evenly
    and leaves each replica a micro-batch (timed at the most micro-batches a replica gets),
    at most one stage per layer.

    The estimate balances the stages by speed (each takes the same time t, so a class's
    stages hold t / (its whole-model time) of the model each) for the fill, and times
    every further micro-batch at the heaviest stage whole layers allow (`_by_whole_layers`);
    it charges every stage a transfer in and out both ways at the cheapest link any class
    has, and adds the sync ring of each class's stages, their parameters in proportion to
    their share of the model, inside a node where n holders fit in one. Where a stage's state alone
    would not fit, or the stages could not hold the model with the activations they keep
    (`_layers_fit`), the grid is ruled out. Estimated for all tp choices and counts of a
    micro-batch size at once (thousands of structures on six classes). `per_param[n - 1]`:
    state bytes per parameter with n replicas."""
    tables, job = ctx.tables, ctx.scenario.job
    batch = job.global_batch_size
    capacity = np.array([tables.capacity_bytes[c.gpu_type] for c in subset])
    largest = np.array([c.largest_node for c in subset])
    inside = [ctx.link(c.key, c.key, same_node=True) for c in subset]
    across = [ctx.link(c.key, c.key, same_node=False) for c in subset]
    rings = [ctx.ring(c.key) for c in subset]
    moved = float(tables.output_bytes[:-1].mean()) if tables.num_layers > 1 else 0.0
    # Per micro-batch size: its structures' estimates (thousands on six classes), ranked
    # together at the end; a _Grid is built only for those the caller takes.
    found: list[_Estimates] = []
    for b in sorted({b for (_, b, _) in tables.points}):
        options = [best_tp.get((c.key, b), []) for c in subset]
        if not all(options):
            continue
        tps = np.array(list(itertools.product(*options)))  # (choices, classes)
        slot_options = [np.array([c.slots(tp) for tp in tp_options])
                        for c, tp_options in zip(subset, options, strict=True)]
        slots = np.array(list(itertools.product(*slot_options)))
        whole = np.array(list(itertools.product(*[
            [float(tables.points[(c.gpu_type, b, tp)].compute_s[-1]) for tp in tp_options]
            for c, tp_options in zip(subset, options, strict=True)])))
        n = np.arange(1, int(slots.min(axis=1).max()) + 1)  # (counts,)
        # Counts that split every class's stages evenly and leave each replica a
        # micro-batch, per choice: each class's options tested once, then gathered.
        which = np.array(list(itertools.product(*[range(len(o)) for o in options])))
        valid = np.broadcast_to(n * b <= batch, (len(tps), len(n)))
        for c, divisible in enumerate(slot_options):
            valid = valid & (divisible[:, None] % n[None, :] == 0)[which[:, c]]
        choice, count = np.nonzero(valid)  # row-major: ties keep this order below
        stages = slots[choice] // n[count][:, None]  # (structures, classes)
        depth = stages.sum(axis=1)
        short = (depth <= tables.max_stages) & (stages.min(axis=1) >= 1)
        choice, count, stages, depth = choice[short], count[short], stages[short], depth[short]
        if not len(choice):
            continue
        counts, their_tps, their_whole = n[count], tps[choice], whole[choice]
        stage_s = 1.0 / (stages / their_whole).sum(axis=1)
        transfer_s = 0.0 if not ctx.blocking else min(
            link.latency_s + moved * b / link.bytes_per_s for link in inside + across)
        steady = -(-batch // (counts * b)) - 1  # micro-batches after the first, the most
        pipeline_s = (steady + depth) * (stage_s + 4 * transfer_s)
        params = float(tables.params[-1]) * stage_s[:, None] / their_whole / their_tps
        fits = (params * per_param[counts - 1][:, None] <= capacity).all(axis=1)
        near = counts[:, None] * their_tps <= largest  # n holders of a stage on a node
        bandwidth = np.where(near, [link.bytes_per_s for link in inside], [r[0] for r in rings])
        latency = np.where(near, [link.latency_s for link in inside], [r[1] for r in rings])
        steps = (counts - 1)[:, None]
        sync_s = (2 * steps / counts[:, None] * params * job.grad_bytes / bandwidth
                  + 2 * steps * latency).max(axis=1)
        found.append(_Estimates(
            micro_batch=np.full(int(fits.sum()), b), balanced_s=(pipeline_s + sync_s)[fits],
            tps=their_tps[fits], counts=counts[fits], stages=stages[fits],
            stage_s=stage_s[fits], steady=steady[fits],
            layer_s=their_whole[fits] / tables.num_layers))
    if not found:
        return
    every = _Estimates(**{name: np.concatenate([getattr(f, name) for f in found])
                          for name in _Estimates.__dataclass_fields__})
    for r in _by_whole_layers(every, tables.num_layers):
        grid = _Grid(classes=subset, micro_batch=int(every.micro_batch[r]),
                     tp=tuple(int(tp) for tp in every.tps[r]), replicas=int(every.counts[r]),
                     stages=tuple(int(x) for x in every.stages[r]))
        # Checked as the caller takes them (a few of thousands), not for every row.
        if _layers_fit(ctx, grid, float(per_param[grid.replicas - 1])):
            yield grid


def _layers_fit(ctx: TemplateContext, grid: _Grid, per_param: float) -> bool:
    """Whether the grid's stages (`per_param`: state bytes per parameter), in some order of
    its classes that `_swept` tries, could hold the model with the micro-batches each keeps
    in flight as the layer DP counts them: every stage at least one layer (the first stage
    the first, the last the last, the others any but those), and all of them together
    every layer, each holding as many as the cheapest of the layers it may hold allows.
    Where they cannot, the DP is sure to find nothing: on a memory-tight LLaMA-7B input,
    structures of 6 to 17 V100 stages at micro-batch 2 (the first ones keeping up to 16
    micro-batches) ranked first and used up the cells that reached the one that won."""
    depth = sum(grid.stages)
    for order in _class_orders(ctx.tables, grid):
        held, behind = 0.0, 0
        for position, (cls, tp, stages) in enumerate(reversed(order)):
            inner, ends = _stage_layers(ctx, cls, grid.micro_batch, tp, per_param)
            top = behind + stages
            # Its middle stages are k = low+1 .. high from the back; the last (k = 1) and
            # the first (k = depth) have their own counts.
            low = behind + (position == 0)
            high = max(top - (position == len(order) - 1), low)
            if high > low and inner[high] - inner[high - 1] < 1:  # fewer as k grows
                break
            held += inner[high] - inner[low]
            if position == 0:
                held += ends[1][1]
            if position == len(order) - 1:
                held += ends[depth][0]
            behind = top
        else:
            if held >= ctx.tables.num_layers:
                return True
    return False


def _stage_layers(ctx: TemplateContext, cls: ResourceClass, b: int, tp: int, per_param: float
                  ) -> tuple[list[float], list[tuple[float, float]]]:
    """For stages of `cls` at (b, tp) k-th from the back (k = 0 .. the deepest pipeline):
    the most middle layers one holds, summed over 1..k, and the most layers the first and
    the last stage hold (-inf where their own layer does not fit). Shared by a search."""
    tables = ctx.tables
    key = ("stage layers", cls.gpu_type, b, tp, per_param, ctx.schedule)
    found = tables.matrices.get(key)
    if found is None:
        num_layers = tables.num_layers
        flight = np.array([ctx.in_flight(b, k) for k in range(tables.max_stages + 1)])
        acts = np.diff(tables.points[(cls.gpu_type, b, tp)].activation_bytes)
        cost = np.diff(tables.params) / tp * per_param + flight[:, None] * acts  # (k, layer)
        cheapest = (cost[:, 1:-1].min(axis=1) if num_layers > 2
                    else np.full(len(flight), np.inf))
        capacity = tables.capacity_bytes[cls.gpu_type]
        each = np.floor(capacity / cheapest)
        each[0] = 0
        room = capacity - cost[:, [0, num_layers - 1]]  # beside its own end layer
        ends = np.where(room >= 0, 1 + np.floor(np.maximum(room, 0) / cheapest[:, None]),
                        -np.inf)
        found = tables.matrices[key] = (np.cumsum(each).tolist(),
                                        [tuple(row) for row in ends.tolist()])
    return cast(tuple[list[float], list[tuple[float, float]]], found)


@dataclass(frozen=True, kw_only=True)
class _Estimates:
    """Structures of one subset (rows), as `_least` estimates them."""

    micro_batch: np.ndarray
    balanced_s: np.ndarray
    """Iteration with every stage at the balanced time: fill, further micro-batches, sync."""
    tps: np.ndarray
    counts: np.ndarray
    stages: np.ndarray
    stage_s: np.ndarray
    """The balanced stage time."""
    steady: np.ndarray
    """Micro-batches after the first, each waiting for the heaviest stage."""
    layer_s: np.ndarray
    """Per class: its mean time per layer."""


def _by_whole_layers(estimates: _Estimates, num_layers: int) -> Iterator[int]:
    """Rows in order of their estimate with whole layers: the fill runs through balanced
    stages, but every further micro-batch waits for the heaviest stage, which whole layers
    may not balance (24 stages over 34 layers: twice the balanced time). The balanced
    estimate is a lower bound of it: rows are corrected in batches in its order, and one
    is given once no row still uncorrected can come before it (ties in balanced order)."""
    order = np.argsort(estimates.balanced_s, kind="stable")
    ready: list[tuple[float, int, int]] = []  # (whole-layer estimate, rank, row)
    done = 0
    batch = CORRECTED_FIRST
    while done < len(order) or ready:
        if done < len(order) and (not ready or ready[0][0] > estimates.balanced_s[order[done]]):
            rows = order[done:done + batch]
            heaviest = _whole_layers_bottleneck(estimates.stages[rows], estimates.layer_s[rows],
                                                num_layers)
            totals = (estimates.balanced_s[rows]
                      + estimates.steady[rows] * (heaviest - estimates.stage_s[rows]))
            for rank, (total, row) in enumerate(zip(totals.tolist(), rows.tolist(),
                                                    strict=True), start=done):
                heapq.heappush(ready, (total, rank, row))
            done += len(rows)
            batch *= 2
            continue
        yield heapq.heappop(ready)[2]


def _whole_layers_bottleneck(stages: np.ndarray, layer_s: np.ndarray, num_layers: int
                             ) -> np.ndarray:
    """Per structure (rows of `stages`, stages per class), the least stage time t at which
    its stages cover the model in whole layers, each of class c holding floor(t / layer_s[c])
    of them and at least one: the layers taken as equal, each class's the mean of its own."""
    low = layer_s.max(axis=1)  # every stage holds a layer
    high = low * num_layers  # every stage holds the whole model
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        covered = (stages * np.floor(mid[:, None] / layer_s * (1 + 1e-12))).sum(axis=1)
        enough = covered >= num_layers
        high = np.where(enough, mid, high)
        low = np.where(enough, low, mid)
    return high


def _class_orders(tables: ScenarioTables, grid: _Grid
                  ) -> list[tuple[tuple[ResourceClass, int, int], ...]]:
    """(class, tp, stages) of the grid's classes in each order its replicas try: every
    order, or with MAX_ORDERS_FROM classes and more, by memory both ways."""
    keys = [(c, tp, s) for c, tp, s in zip(grid.classes, grid.tp, grid.stages, strict=True)]
    if len(keys) < MAX_ORDERS_FROM:
        return list(itertools.permutations(keys))
    by_memory = sorted(keys, key=lambda k: -tables.capacity_bytes[k[0].gpu_type])
    return [tuple(by_memory), tuple(reversed(by_memory))]


def _swept(ctx: TemplateContext, grid: _Grid, *, least_time: bool = True
           ) -> Iterator[PipelineTemplate]:
    """The grid's pipelines in each order of its classes, with their least-bottleneck splits
    and (if `least_time`), where faster, their splits of least time for the grid's
    micro-batches."""
    micro_batches = -(-ctx.scenario.job.global_batch_size // (grid.replicas * grid.micro_batch))
    for order in _class_orders(ctx.tables, grid):
        stages = [StageShape(resource=c.key, tp=tp) for c, tp, s in order for _ in range(s)]
        yield from _split(ctx, stages, grid.micro_batch, grid.replicas, micro_batches,
                          least_time=least_time)


def _split(ctx: TemplateContext, stages: list[StageShape], b: int, replicas: int,
           micro_batches: int, *, least_time: bool = True) -> Iterator[PipelineTemplate]:
    """The least-bottleneck split of `stages` and, where it is faster for the grid's
    micro-batches, the split of least time (few micro-batches: the fill weighs), a class's
    neighbouring stages priced at its node's link (placed stage-major, they are not: the
    estimator judges the placed plan; priced across nodes, the splits found lost a 5%
    faster grid on the shared scenarios)."""
    depth = len(stages)
    sweep = SuffixSweep(ctx.tables, blocking=ctx.blocking, num_pipelines=replicas)
    for k in range(1, depth + 1):
        shape = stages[depth - k]
        front = stages[depth - k - 1] if k < depth else shape
        link = ctx.link(front.resource, shape.resource, same_node=front.resource == shape.resource)
        sweep.push(ctx.stage_spec(shape, b, k, link))
        if not sweep.extendable() and k < depth:
            return
    # Under `local` the fill model does not hold, and the shared split replaces this one.
    timed = (None if ctx.schedule is Schedule.LOCAL or not least_time
             else sweep.extract_least_time(depth, micro_batches))
    for part in (sweep.extract(depth), timed):
        template = None if part is None else template_from_partition(ctx, sweep.specs, part, b,
                                                                     stages)
        if template is not None:
            yield template
