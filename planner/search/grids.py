"""Identical pipelines over several GPU classes: the grid a careful engineer lays over a
mixed fleet.

With a launcher that runs identical replicas, an engineer gives every replica an equal
share of each class: n replicas, each with slots_c / n stages of class c in a row (at the
class's tp), the classes in some order, the layers split by speed. The `unaware` baseline
has this shape with an even split, and the two-segment templates have two classes with
tails of a few sizes; here every class of a subset is in each replica: all classes and,
with three or more, all but one (a slow type left idle). Each class runs at one of four
tp (three past 256 GPUs; four is every profiled one, as profiles go): those its fastest
homogeneous pipelines use at the micro-batch size, then those of least compute per sample,
for every replica count that splits every class evenly and leaves each replica a
micro-batch (the shares of the batch differing by one micro-batch where the count does not
divide it: counts dividing the batch alone were few on large fleets, none at 4,080 GPUs of
the benchmark inputs). On fleets of up to 256 GPUs, and of up to 512 with at most four
classes, the counts that leave some class fewer stages over than replicas, idle, are a
family of their own (a class of 17 nodes splits evenly 17 ways only), swept within a budget
of their own (IDLE_CELLS).

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

import functools
import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

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

__all__ = ["GridFamilies", "grid_candidates"]

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
"""(A second lot of structures swept up to 8,192 cells on large fleets, judged as a family
of their own, made up for structures of many replicas that a closed form blind to memory
and links ranked out of reach. With `_heaviest_stage` ranking them, on 400 held-out inputs
at four times their size it changed three plans, two 0.5% slower and one 0.9% faster:
dropped, with its sweeps.)"""
KEPT = 6
"""Grid drafts, least rough time first, placed and offered to the search."""
KEPT_ZONED = 8
"""The same on fleets of several zones, where four classes or more are also tried zone by
zone: with six, a held-out input's best grid, in memory order, lost its place to
zone-by-zone drafts of less rough time that placed worse (0.7% slower)."""
TP_PER_CLASS = 4
"""tp options per class and micro-batch size, fastest per GPU first: with tp 1, 2, 4 and 8
profiled, every one. A third one lets a class trade some speed per GPU for fewer, larger
stages (on a perturbed 32-GPU LLaMA-7B input, two A10 tp4 stages in front of four H100 tp2
ones: 2.5% faster than the best grid with two options). The fourth is the one a class holding
a few layers of a grid needs where its homogeneous pipelines, which must hold the whole model,
rank it last: 16 V100-16Gs whose pipelines fit at tp 4 and 8 only, tp 1 the least compute
per sample, run a grid's last layers best at tp 2 (test_grid_tp: 7% faster than at tp 4).
On fleets of up to SWEPT_CELLS_FULL_UP_TO GPUs; TP_PER_CLASS_LARGE_FLEET beyond."""
TP_PER_CLASS_LARGE_FLEET = 3
"""Past SWEPT_CELLS_FULL_UP_TO GPUs: a fourth option multiplies the structures estimated in
closed form by (4/3)^classes, and with six classes it cost the 512-GPU timing input 29% of
its planning time (0.82 -> 1.06 s, the same plan) on the forked child's path."""
CORRECTED_FIRST = 64
"""Structures whose whole-layer estimate `_least` computes at once, in order of their
balanced estimate; each further batch twice the last (most callers take a few)."""
BISECTIONS = 22
"""Halvings of the interval searched for a structure's whole-layer bottleneck: 2^-22 of it,
then set on the step it ends in."""
MAX_ORDERS_FROM = 4
"""With this many classes or more, two orders are swept (by memory, both ways), not all."""
IDLE_CELLS = 32768
"""Cells (as SWEPT_CELLS counts them) that the grids leaving some GPUs of a class idle may
sweep in all, their structures taken best first by the closed form across every subset.
Swept as the even grids are (SWEPT and SWEPT_CELLS per subset), they found no more on 400
held-out inputs and made the six-type 130-layer input at 240 GPUs plan 60% longer; the
subsets taken in turn, first structures first, missed a fleet's zone alone (its part's plan
2.8% faster than the whole fleet's)."""
IDLE_CELLS_LARGE_FLEET = 16384
"""IDLE_CELLS past SWEPT_CELLS_FULL_UP_TO GPUs (where `_widened`)."""
FEW_CLASSES = 4
"""Past SWEPT_CELLS_FULL_UP_TO GPUs and up to FEW_CLASSES_UP_TO, fleets of at most this many
classes still get the grids that leave GPUs idle and the wider set of class orders. Their
structures are few (each class multiplies them by its tp options and counts): on three
held-out inputs of 320-480 GPUs these found plans 6-19% faster for 0.0-0.1 s; on the
six-class timing input at 512 GPUs the idle grids' closed form alone took 0.13 s and found
none, and the orders cost 0.16 s."""
FEW_CLASSES_UP_TO = 512
"""Past this many GPUs, FEW_CLASSES no longer widens the grids: the idle grids' closed form
checks memory for every replica count, and at 4,096 GPUs widened grids made the three- and
four-class timing inputs plan 40-50% and 20% longer (1.4-1.6 -> 2.1 s, 1.6 -> 1.9-2.0 s),
the same plans."""


@dataclass(frozen=True, kw_only=True)
class _Grid:
    classes: tuple[ResourceClass, ...]
    micro_batch: int
    tp: tuple[int, ...]
    replicas: int
    stages: tuple[int, ...]
    """Stages of each class in one replica."""
    estimate_s: float = field(default=0.0, compare=False)
    """Its iteration in closed form, whole layers counted (`_least`'s ranking)."""


class GridFamilies(NamedTuple):
    """Placed grids, each family best first by the quick estimate."""

    even: list[Candidate]
    """Replica counts that split every class's stages evenly."""
    with_idle: list[Candidate]
    """Counts that leave some class a few stages idle (where `_widened`): judged as a family
    of their own."""


def grid_candidates(tables: ScenarioTables) -> GridFamilies:
    """Placed grids. Each class's homogeneous pipelines of every depth rank its tp (swept
    once per search: free after the per-type baseline)."""
    if len(tables.classes) < 2:
        return GridFamilies(even=[], with_idle=[])
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    # Under ZeRO, state sharded over replicas fits at lower tp: the per-type baseline's
    # pipelines sized for several count too.
    hints = (1, SHARDED_OVER) if tables.scenario.job.zero_stage >= 1 else (1,)
    templates = [t for cls in tables.classes for hint in hints
                 for t in homogeneous_templates(ctx, cls, num_pipelines=hint)]
    small_fleet = tables.num_gpus <= SWEPT_CELLS_FULL_UP_TO
    best_tp = _best_tp(tables, templates,
                       per_class=TP_PER_CLASS if small_fleet else TP_PER_CLASS_LARGE_FLEET)
    # State bytes per parameter by replica count (ZeRO shards it): read by every subset
    # and micro-batch size, for counts up to the most stages any class hosts.
    most = max(c.slots(1) for c in tables.classes)
    per_param = np.array([state_bytes_per_param(tables.scenario, n).total
                          for n in range(1, most + 1)])
    budget = SWEPT_CELLS if small_fleet else SWEPT_CELLS_LARGE_FLEET
    keep = KEPT_ZONED if len({c.zone for c in tables.classes}) >= 2 else KEPT

    def placed(idle: bool) -> list[Candidate]:
        if idle:
            swept = _swept_best_first(ctx, heapq.merge(
                *(_least(ctx, subset, best_tp, per_param, idle=True)
                  for subset in _subsets(tables)), key=lambda grid: grid.estimate_s),
                IDLE_CELLS if small_fleet else IDLE_CELLS_LARGE_FLEET)
        else:
            swept = (found for subset in _subsets(tables)
                     for found in _swept_within(ctx, _least(ctx, subset, best_tp, per_param),
                                                budget))
        drafts = (replicas_draft(tables, template, grid.replicas, "identical pipelines through "
                                 + ", ".join(dict.fromkeys(s.gpu_type for s in template.stages))
                                 + (", some GPUs of a class idle" if idle else ""))
                  for grid, template in swept)
        return best_realized(tables, drafts, keep)

    return GridFamilies(even=placed(idle=False),
                        with_idle=placed(idle=True) if _widened(tables) else [])


def _widened(tables: ScenarioTables) -> bool:
    """Whether the grids leaving GPUs idle and the wider set of class orders are tried: on
    fleets of up to SWEPT_CELLS_FULL_UP_TO GPUs, and of up to FEW_CLASSES_UP_TO with at most
    FEW_CLASSES classes."""
    return tables.num_gpus <= SWEPT_CELLS_FULL_UP_TO or (
        tables.num_gpus <= FEW_CLASSES_UP_TO and len(tables.classes) <= FEW_CLASSES)


def _best_tp(tables: ScenarioTables, templates: Sequence[PipelineTemplate], *,
             per_class: int = TP_PER_CLASS) -> dict[tuple[ClassKey, int], list[int]]:
    """Per class and micro-batch size, `per_class` tp: those of its fastest homogeneous
    pipelines per GPU, then those of least compute per sample. A class too small or too
    memory-poor to hold the model alone at some tp (or at any) may still hold a grid's few
    layers there: the
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
        best[key] = ranked[:per_class]
    return best


def _subsets(tables: ScenarioTables) -> list[tuple[ResourceClass, ...]]:
    """`_reductions` of all classes; with several zones, also each type's classes alone
    (with two or more types) and the reductions of each zone's classes alone and, with
    three or more zones, of all zones' but each one's: a grid whose rings cross a slow link
    between zones can lose to one that leaves a zone idle, or a type, or both."""
    classes = tables.classes
    subsets = _reductions(classes)
    types = sorted({c.gpu_type for c in classes})
    zones = sorted({c.zone or "" for c in classes})
    if len(zones) >= 2:
        if len(types) >= 2:
            subsets += [tuple(c for c in classes if c.gpu_type == kept) for kept in types]
        kept = [{z} for z in zones] + ([set(zones) - {z} for z in zones] if len(zones) >= 3
                                       else [])
        for allowed in kept:
            subsets += _reductions(tuple(c for c in classes if (c.zone or "") in allowed))
    unique: dict[tuple[tuple[str, str | None], ...], tuple[ResourceClass, ...]] = {}
    for subset in subsets:
        if subset:
            unique.setdefault(tuple(c.key for c in subset), subset)
    return list(unique.values())


def _reductions(classes: tuple[ResourceClass, ...]) -> list[tuple[ResourceClass, ...]]:
    """`classes`; with three or more, all but each one; with three or more GPU types, all
    but each type's (a type spread over zones is several classes)."""
    subsets = [classes]
    if len(classes) >= 3:
        subsets += [tuple(c for c in classes if c is not left) for left in classes]
    types = sorted({c.gpu_type for c in classes})
    if len(types) >= 3:
        subsets += [tuple(c for c in classes if c.gpu_type != left) for left in types]
    return subsets


def _swept_within(ctx: TemplateContext, ranked: Iterator[_Grid], budget: float
                  ) -> Iterator[tuple[_Grid, PipelineTemplate]]:
    """The pipelines of the first SWEPT structures of `ranked` that give any, passing over
    fewer than SWEPT that give none (a structure the closed form let through may not fit in
    memory once split), then of more while their sweeps cover at most `budget` cells
    (layers x stages x orders of the classes). On thousands of GPUs most structures ranked
    first may not fit: passing over every one of them tripled the grids' time at 8,192."""
    kept = failed = 0
    cells = 0
    for grid in ranked:
        if kept >= SWEPT or failed >= SWEPT:
            cells += _sweep_cells(ctx, grid)
            if cells > budget:
                return
        found = list(_swept(ctx, grid))
        kept += bool(found)
        failed += not found
        yield from ((grid, template) for template in found)


def _sweep_cells(ctx: TemplateContext, grid: _Grid) -> int:
    """What sweeping `grid` covers: layers x stages x orders of its classes."""
    return ctx.tables.num_layers * sum(grid.stages) * len(_class_orders(ctx.tables, grid))


def _swept_best_first(ctx: TemplateContext, ranked: Iterator[_Grid], budget: float
                      ) -> Iterator[tuple[_Grid, PipelineTemplate]]:
    """The pipelines of `ranked`'s structures while their sweeps cover at most `budget`
    cells in all."""
    cells = 0
    for grid in ranked:
        cells += _sweep_cells(ctx, grid)
        if cells > budget:
            return
        yield from ((grid, template) for template in _swept(ctx, grid))


def _least(ctx: TemplateContext, subset: tuple[ResourceClass, ...],
           best_tp: dict[tuple[ClassKey, int], list[int]], per_param: np.ndarray, *,
           idle: bool = False) -> Iterator[_Grid]:
    """The grids of `subset`, least estimated iteration first: every micro-batch size, tp
    per class among its best, and replica count n that splits every class's stages evenly
    (with `idle`, instead, every n that leaves some class fewer than n stages over, idle:
    a class of 17 nodes splits evenly 17 ways only) and leaves each replica a micro-batch
    (timed at the most micro-batches a replica gets), at most one stage per layer.

    The estimate balances the stages by speed (each takes the same time t, so a class's
    stages hold t / (its whole-model time) of the model each) for the fill, and times
    every further micro-batch at the heaviest stage whole layers, memory and links allow
    (`_heaviest_stage`); it charges every stage a transfer in and out both ways at the
    cheapest link any class has, and adds the sync ring of each class's stages, their
    parameters in proportion to their share of the model, inside a node where n holders fit
    in one. Where a stage's state alone would not fit, or the stages could not hold the
    model with the activations they keep, the grid is ruled out. Estimated for all tp
    choices and counts of a micro-batch size at once (thousands of structures on six
    classes). `per_param[n - 1]`: state bytes per parameter with n replicas."""
    # Per micro-batch size: its structures' estimates (thousands on six classes), ranked
    # together at the end; a _Grid is built only for those the caller takes.
    found: list[_Estimates] = []
    for b in sorted({b for (_, b, _) in ctx.tables.points}):
        options = [best_tp.get((c.key, b), []) for c in subset]
        structures = _structures(ctx, subset, options, b, idle=idle) if all(options) else None
        estimates = None if structures is None else _balanced(ctx, subset, structures, per_param)
        if estimates is not None:
            found.append(estimates)
    if not found:
        return
    every = _Estimates(**{name: np.concatenate([getattr(f, name) for f in found])
                          for name in _Estimates.__dataclass_fields__})

    rooms = _rooms(ctx, subset, every, per_param)
    # Per class first, a lower bound that is cheap: the memory and links of each stage
    # are costly on thousands of structures.
    heaviest: list[Callable[[np.ndarray], np.ndarray]] = [
        functools.partial(_heaviest_per_class, ctx, subset, every, rooms),
        functools.partial(_heaviest_stage, ctx, subset, every, rooms)]
    for estimate_s, r in _by_whole_layers(every, heaviest):
        yield _Grid(classes=subset, micro_batch=int(every.micro_batch[r]),
                    tp=tuple(int(tp) for tp in every.tps[r]), replicas=int(every.counts[r]),
                    stages=tuple(int(x) for x in every.stages[r]), estimate_s=estimate_s)


@dataclass(frozen=True, kw_only=True)
class _Structures:
    """Structures of one subset and micro-batch size (rows), not yet estimated."""

    micro_batch: int
    counts: np.ndarray
    """(rows,): replicas."""
    tps: np.ndarray
    stages: np.ndarray
    """(rows, classes): each class's tp and stages in one replica."""
    whole_s: np.ndarray
    """(rows, classes): a micro-batch through every layer at each class's point."""


def _structures(ctx: TemplateContext, subset: tuple[ResourceClass, ...],
                options: list[list[int]], b: int, *, idle: bool) -> _Structures | None:
    """`_least`'s structures of micro-batch size b: every choice of tp per class among its
    `options` and every count that splits each class's stages evenly (with `idle`, that
    does not), leaves each replica a micro-batch and gives it at most one stage per layer
    and at least one stage of each class; None where there is none."""
    tables = ctx.tables
    tps = np.array(list(itertools.product(*options)))  # (choices, classes)
    slot_options = [np.array([c.slots(tp) for tp in tp_options])
                    for c, tp_options in zip(subset, options, strict=True)]
    slots = np.array(list(itertools.product(*slot_options)))
    whole = np.array(list(itertools.product(*[
        [float(tables.points[(c.gpu_type, b, tp)].compute_s[-1]) for tp in tp_options]
        for c, tp_options in zip(subset, options, strict=True)])))
    n = np.arange(1, int(slots.min(axis=1).max()) + 1)  # (counts,)
    # Whether each count splits every class's stages evenly, per choice: each class's
    # options tested once, then gathered.
    which = np.array(list(itertools.product(*[range(len(o)) for o in options])))
    even = np.ones((len(tps), len(n)), dtype=bool)
    for c, divisible in enumerate(slot_options):
        even = even & (divisible[:, None] % n[None, :] == 0)[which[:, c]]
    valid = (n * b <= tables.scenario.job.global_batch_size) & (~even if idle else even)
    choice, count = np.nonzero(valid)  # row-major: ties keep this order downstream
    stages = slots[choice] // n[count][:, None]  # (structures, classes)
    short = (stages.sum(axis=1) <= tables.max_stages) & (stages.min(axis=1) >= 1)
    if not short.any():
        return None
    choice, count = choice[short], count[short]
    return _Structures(micro_batch=b, counts=n[count], tps=tps[choice], stages=stages[short],
                       whole_s=whole[choice])


def _balanced(ctx: TemplateContext, subset: tuple[ResourceClass, ...], found: _Structures,
              per_param: np.ndarray) -> _Estimates | None:
    """`_least`'s closed form of `found` (stages balanced by speed, transfers at the
    cheapest link, each class's ring), the structures whose stages' state fits; None where
    none does."""
    tables, job = ctx.tables, ctx.scenario.job
    b, counts, tps, stages, whole = (found.micro_batch, found.counts, found.tps, found.stages,
                                     found.whole_s)
    inside = [ctx.link(c.key, c.key, same_node=True) for c in subset]
    across = [ctx.link(c.key, c.key, same_node=False) for c in subset]
    rings = [ctx.ring(c.key) for c in subset]
    stage_s = 1.0 / (stages / whole).sum(axis=1)
    moved = _mean_output(ctx) * b  # bytes of one micro-batch between stages
    transfer_s = 0.0 if not ctx.blocking else min(
        link.latency_s + moved / link.bytes_per_s for link in inside + across)
    steady = -(-job.global_batch_size // (counts * b)) - 1  # micro-batches after the first
    step_s = stage_s + 4 * transfer_s  # a micro-batch through a balanced stage
    pipeline_s = (steady + stages.sum(axis=1)) * step_s
    params = float(tables.params[-1]) * stage_s[:, None] / whole / tps
    capacity = np.array([tables.capacity_bytes[c.gpu_type] for c in subset])
    fits = (params * per_param[counts - 1][:, None] <= capacity).all(axis=1)
    if not fits.any():
        return None
    largest = np.array([c.largest_node for c in subset])
    near = counts[:, None] * tps <= largest  # n holders of a stage on a node
    bandwidth = np.where(near, [link.bytes_per_s for link in inside], [r[0] for r in rings])
    latency = np.where(near, [link.latency_s for link in inside], [r[1] for r in rings])
    steps = (counts - 1)[:, None]
    sync_s = (2 * steps / counts[:, None] * params * job.grad_bytes / bandwidth
              + 2 * steps * latency).max(axis=1)
    return _Estimates(
        micro_batch=np.full(int(fits.sum()), b), balanced_s=(pipeline_s + sync_s)[fits],
        tps=tps[fits], counts=counts[fits], stages=stages[fits], step_s=step_s[fits],
        steady=steady[fits])


def _heaviest_per_class(ctx: TemplateContext, subset: tuple[ResourceClass, ...],
                        estimates: _Estimates, rooms: _Rooms, rows: np.ndarray) -> np.ndarray:
    """A lower bound of `_heaviest_stage`, per class rather than per stage (cheap on
    thousands of structures): every stage of a class pays the cheapest transfer its class
    has with any (twice in the middle, where all of its stages but one at most are), none
    holds an end layer, and the class's stages together hold no more than they would at
    the back of the pipeline, where they keep the fewest micro-batches in flight."""
    stages = estimates.stages[rows]
    layer_s = rooms.layer_s[rooms.which[rows]]  # (rows, classes)
    at_back = np.cumsum(rooms.middle, axis=1)[rooms.which[rows], stages]
    if ctx.blocking:
        latency, per_byte = _links(ctx, subset)
        moved = estimates.micro_batch[rows] * _mean_output(ctx)
        each = latency + moved[:, None, None] * per_byte
        cheapest = np.minimum(each.min(axis=2), each.min(axis=1))  # (rows, classes)
    else:
        cheapest = np.zeros(stages.shape)
    middle, end = 4 * cheapest, 2 * cheapest  # in and out, forward and backward
    needed = ctx.tables.num_layers - 2

    def covered(t: np.ndarray) -> np.ndarray:
        def held(start: np.ndarray) -> np.ndarray:
            return np.maximum(np.floor((t[:, None] - start) / layer_s * (1 + 1e-12)), 0.0)
        return np.minimum((stages - 1) * held(middle) + held(end), at_back).sum(axis=1)

    low = np.where(stages >= 2, middle + layer_s, end).max(axis=1)  # a layer in the middle
    high = low + layer_s.max(axis=1) * max(needed, 1)
    possible = covered(high) >= needed
    low, high = _bisected(low, high, lambda t: covered(t) >= needed)
    return np.where(possible, low, np.inf)  # never above the least t


def _links(ctx: TemplateContext, subset: tuple[ResourceClass, ...]
           ) -> tuple[np.ndarray, np.ndarray]:
    """(latency s, s per byte) between stages of each pair of classes (front, back), as
    `_split` prices them: a class's own neighbours on its node's link."""
    links = [[ctx.link(front.key, back.key, same_node=front.key == back.key) for back in subset]
             for front in subset]
    return (np.array([[link.latency_s for link in row] for row in links]),
            np.array([[1 / link.bytes_per_s for link in row] for row in links]))


def _mean_output(ctx: TemplateContext) -> float:
    """Bytes a layer hands the next per sample, on average (the last hands none)."""
    tables = ctx.tables
    return float(tables.output_bytes[:-1].mean()) if tables.num_layers > 1 else 0.0


def _heaviest_stage(ctx: TemplateContext, subset: tuple[ResourceClass, ...],
                    estimates: _Estimates, rooms: _Rooms, rows: np.ndarray) -> np.ndarray:
    """Per structure (`rows` of `estimates`), the least time of one micro-batch through its
    heaviest stage at which its stages, in the best order of its classes that `_swept`
    tries, cover the model in whole layers. The first and last stage hold the model's end
    layer (an embedding, a head) at its own time and memory; each stage holds floor((t -
    its transfers - that layer) / its class's mean layer time) of the layers between, at
    least one in the middle, no more than it can keep in memory with the micro-batches it
    has in flight as the layer DP counts them. Its transfers are priced as `_split` prices
    them, at the model's mean layer output. Where no order can hold the model, infinite:
    the structure is ruled out. On a model whose layers between its end ones are alike,
    this is the layer DP's least bottleneck.

    Why each term: the front stages of 1F1B keep the most micro-batches (on a memory-tight
    LLaMA-7B input they held one or two layers of a V100 pair's six), a stage next to a
    slow link holds fewer (there a stage each side of a link between zones paid 47 ms a
    micro-batch, more than a layer pair's compute), and an embedding costs next to nothing
    (taken for a block, it put an estimate 26% above the DP's). The estimate that gave
    every stage its balanced share of mean layers and the cheapest link ranked the grid
    that won ninth, out of reach of the sweeps on large fleets."""
    # Rows of like depth together: arrays padded to the deepest of a few, not of them all.
    depth = estimates.stages[rows].sum(axis=1)
    bucket = np.ceil(np.log2(depth))
    found = np.empty(len(rows))
    for value in np.unique(bucket):
        alike = bucket == value
        found[alike] = _heaviest_of_alike(ctx, subset, estimates, rooms, rows[alike])
    return found


def _heaviest_of_alike(ctx: TemplateContext, subset: tuple[ResourceClass, ...],
                       estimates: _Estimates, rooms: _Rooms, rows: np.ndarray
                       ) -> np.ndarray:
    """`_heaviest_stage` of some rows, every order of their classes at once."""
    tables = ctx.tables
    stages = estimates.stages[rows]  # (rows, classes)
    b = estimates.micro_batch[rows]
    depth = stages.sum(axis=1)
    position = np.arange(int(depth.max()))  # from the front
    real = position[None, :] < depth[:, None]  # (rows, positions)
    from_back = np.maximum(depth[:, None] - position[None, :], 1)
    which, middle, first, last = rooms.which[rows], rooms.middle, rooms.first, rooms.last
    layer_s, first_s, last_s = rooms.layer_s, rooms.first_s, rooms.last_s
    ends = (position[None, :] == 0, from_back == 1)
    moved = _mean_output(ctx)
    latency, per_byte = _links(ctx, subset)
    pairs = np.arange(len(rows))[:, None]
    # Every order at once (orders, rows, positions): the class of every position is the
    # first of the order whose stages reach past it.
    orders = np.array(_order_indices(tables, subset))
    reach = np.cumsum(stages[:, orders].transpose(1, 0, 2), axis=2)  # (orders, rows, classes)
    at = np.take_along_axis(orders[:, None, :], np.minimum(
        (reach[:, :, None, :] <= position[None, None, :, None]).sum(axis=3),
        len(subset) - 1), axis=2)
    room = which[pairs, at]
    most = np.where(ends[0], first[room, from_back],
                    np.where(ends[1], last[room, 1], middle[room, from_back]))
    own = np.where(ends[0], first_s[room], np.where(ends[1], last_s[room], 0.0))
    if ctx.blocking:
        # Each transfer in and out, forward and backward, charged to its stage.
        crossing = np.where(real[:, 1:], latency[at[..., :-1], at[..., 1:]]
                            + (b * moved)[:, None] * per_byte[at[..., :-1], at[..., 1:]], 0.0)
        paid = 2 * (np.pad(crossing, ((0, 0), (0, 0), (1, 0)))
                    + np.pad(crossing, ((0, 0), (0, 0), (0, 1))))
    else:
        paid = np.zeros(room.shape)
    least = np.where(real & ~ends[0] & ~ends[1], 1.0, 0.0)
    # A stage without room for its least holds nothing: no t covers the model.
    return _whole_layers_bottleneck(
        np.where(real, layer_s[room], np.inf), paid + own,
        np.where(real, np.where(most >= least, most, -np.inf), 0.0), least,
        tables.num_layers - 2).min(axis=0)


@dataclass(frozen=True, kw_only=True)
class _Rooms:
    """What the stages of some structures can hold, per distinct (class, micro-batch size,
    tp, state share) among them: `which[row, class]` indexes the arrays below."""

    which: np.ndarray
    middle: np.ndarray
    first: np.ndarray
    last: np.ndarray
    """(room, k): the most layers a stage k-th from the back holds (`_stage_layers`)."""
    layer_s: np.ndarray
    first_s: np.ndarray
    last_s: np.ndarray
    """(room,): the layer times of `_layer_times`."""


def _rooms(ctx: TemplateContext, subset: tuple[ResourceClass, ...], estimates: _Estimates,
           per_param: np.ndarray) -> _Rooms:
    """The rooms of every row of `estimates` (`per_param[n - 1]`: state bytes per parameter
    with n replicas)."""
    _, share = np.unique(per_param, return_inverse=True)
    points = ctx.tables.points
    sizes = np.array(sorted({b for (_, b, _) in points}))
    tp_values = np.array(sorted({tp for (_, _, tp) in points}))
    tps = estimates.tps
    # One integer per (class, micro-batch size, tp, share), a few distinct among thousands:
    # those present numbered in order (a sort of them all cost more than the rest).
    size = np.searchsorted(sizes, estimates.micro_batch)[:, None]
    keys = ((np.arange(len(subset))[None, :] * len(sizes) + size) * len(tp_values)
            + np.searchsorted(tp_values, tps)) * (share.max() + 1) + share[
        estimates.counts - 1][:, None]
    present = np.zeros(int(keys.max()) + 1, dtype=bool)
    present[keys] = True
    number = np.cumsum(present) - 1
    seen_at = np.zeros(len(present), dtype=int)
    seen_at[keys.ravel()] = np.arange(keys.size)  # any (row, class) with that key
    rows, classes = np.unravel_index(seen_at[present], tps.shape)
    which = number[keys]
    wanted = [(c, b, int(tps[r, c]), float(per_param[n - 1]))
              for r, c, b, n in zip(rows.tolist(), classes.tolist(),
                                    estimates.micro_batch[rows].tolist(),
                                    estimates.counts[rows].tolist(), strict=True)]
    # Under ZeRO each replica count has its own state share: thousands of rooms on large
    # fleets, computed a (class, b, tp) at a time for all their shares.
    shares: dict[tuple[int, int, int], set[float]] = {}
    for c, b, tp, state in wanted:
        shares.setdefault((c, b, tp), set()).add(state)
    layer_times = {}
    for (c, b, tp), states in shares.items():
        _stage_layers_by_share(ctx, subset[c], b, tp, sorted(states))
        layer_times[(c, b, tp)] = _layer_times(ctx.tables, subset[c], b, tp)
    found = [_stage_layers(ctx, subset[c], b, tp, state) for c, b, tp, state in wanted]
    held = [np.array([f[side] for f in found]) for side in range(3)]
    times = np.array([layer_times[(c, b, tp)] for c, b, tp, _ in wanted])
    return _Rooms(which=which, middle=held[0], first=held[1], last=held[2],
                  layer_s=times[:, 0], first_s=times[:, 1], last_s=times[:, 2])


def _stage_layers(ctx: TemplateContext, cls: ResourceClass, b: int, tp: int, per_param: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For stages of `cls` at (b, tp) k-th from the back (k = 0 .. the deepest pipeline):
    the most layers between the model's end ones that one in the middle holds, that the
    first holds beside the model's first layer and the last beside its last (-inf where
    that layer alone does not fit), with the micro-batches it keeps in flight as the layer
    DP counts them, each as many as the cheapest allows. Shared by a search."""
    key = ("stage layers", cls.gpu_type, b, tp, per_param, ctx.schedule)
    if key not in ctx.tables.matrices:
        _stage_layers_by_share(ctx, cls, b, tp, [per_param])
    return cast(tuple[np.ndarray, np.ndarray, np.ndarray], ctx.tables.matrices[key])


def _stage_layers_by_share(ctx: TemplateContext, cls: ResourceClass, b: int, tp: int,
                           per_params: list[float]) -> None:
    """`_stage_layers` for several state bytes per parameter at once, each kept for the
    search."""
    tables = ctx.tables
    keys = [("stage layers", cls.gpu_type, b, tp, per_param, ctx.schedule)
            for per_param in per_params]
    missing = [k for k, key in enumerate(keys) if key not in tables.matrices]
    if not missing:
        return
    num_layers = tables.num_layers
    flight = np.array([ctx.in_flight(b, k) for k in range(tables.max_stages + 1)])
    acts = np.diff(tables.points[(cls.gpu_type, b, tp)].activation_bytes)
    shares = np.array([per_params[k] for k in missing])
    # (share, k, layer), summed in the order one share at a time sums it.
    cost = (np.diff(tables.params) / tp)[None, None, :] * shares[:, None, None] + (
        flight[:, None] * acts)[None]
    cheapest = (cost[:, :, 1:-1].min(axis=2) if num_layers > 2
                else np.full((len(missing), len(flight)), np.inf))
    capacity = tables.capacity_bytes[cls.gpu_type]
    middle = np.floor(capacity / cheapest)
    middle[:, 0] = 0
    room = capacity - cost[:, :, [0, num_layers - 1]]  # beside its own end layer
    ends = np.where(room >= 0, np.floor(np.maximum(room, 0) / cheapest[:, :, None]), -np.inf)
    for row, k in enumerate(missing):
        tables.matrices[keys[k]] = (middle[row], ends[row, :, 0], ends[row, :, 1])


def _layer_times(tables: ScenarioTables, cls: ResourceClass, b: int, tp: int
                 ) -> tuple[float, float, float]:
    """Forward and backward at (b, tp) on `cls`: the mean of a layer between the model's
    end ones, its first layer's and its last's."""
    compute = tables.points[(cls.gpu_type, b, tp)].compute_s
    inner = tables.num_layers - 2
    first, last = float(compute[1] - compute[0]), float(compute[-1] - compute[-2])
    mean = float(compute[-2] - compute[1]) / inner if inner > 0 else max(first, last)
    return mean, first, last


@dataclass(frozen=True, kw_only=True)
class _Estimates:
    """Structures of one subset (rows), as `_least` estimates them."""

    micro_batch: np.ndarray
    balanced_s: np.ndarray
    """Iteration with every stage at the balanced time: fill, further micro-batches, sync."""
    tps: np.ndarray
    counts: np.ndarray
    stages: np.ndarray
    step_s: np.ndarray
    """A micro-batch through a balanced stage, its transfers at the cheapest link."""
    steady: np.ndarray
    """Micro-batches after the first, each waiting for the heaviest stage."""


def _by_whole_layers(estimates: _Estimates,
                     heaviest: Sequence[Callable[[np.ndarray], np.ndarray]]
                     ) -> Iterator[tuple[float, int]]:
    """(estimate, row) in order of the estimate with whole layers: the fill runs through
    balanced stages, but every further micro-batch waits for the heaviest stage, which whole
    layers, memory and links may not balance (24 stages over 34 layers: twice the balanced
    time).
    `heaviest` estimates that stage for some rows, each estimate at least the one before it
    and dearer: the last one counts. The balanced estimate is a lower bound of them all:
    rows are corrected by the first in batches in its order, by the next in the order that
    gives, and so on; a row is given once no row still uncorrected can come before it (ties
    in the order before). Rows no order of stages can hold (infinite) are not given."""
    def total(slowest: Callable[[np.ndarray], np.ndarray], rows: np.ndarray) -> np.ndarray:
        found = slowest(rows)
        possible = np.isfinite(found)
        # Never below the balanced estimate: stages at the ends transfer half as much.
        return np.where(possible, estimates.balanced_s[rows] + estimates.steady[rows]
                        * np.maximum(0.0, np.where(possible, found, 0.0)
                                     - estimates.step_s[rows]), np.inf)

    order = np.argsort(estimates.balanced_s, kind="stable")
    ranked: Iterator[tuple[float, int]] = zip(estimates.balanced_s[order].tolist(),
                                              order.tolist(), strict=True)
    for slowest in heaviest:
        ranked = _refined(ranked, functools.partial(total, slowest))
    return ranked


def _refined(ranked: Iterator[tuple[float, int]], refine: Callable[[np.ndarray], np.ndarray]
             ) -> Iterator[tuple[float, int]]:
    """(key, row) in order of `refine`'s keys, from (lower bound of it, row) in order of the
    bound, refining in batches, each twice the last, only as far as the order needs;
    infinite keys dropped."""
    ready: list[tuple[float, int, int]] = []  # (key, rank, row)
    upcoming = next(ranked, None)
    done = 0
    batch = CORRECTED_FIRST
    while upcoming is not None or ready:
        if upcoming is not None and (not ready or ready[0][0] > upcoming[0]):
            rows = [upcoming[1], *(row for _, row in itertools.islice(ranked, batch - 1))]
            for rank, (key, row) in enumerate(zip(refine(np.array(rows)).tolist(), rows,
                                                  strict=True), start=done):
                if key < np.inf:
                    heapq.heappush(ready, (key, rank, row))
            done += len(rows)
            batch *= 2
            upcoming = next(ranked, None)
            continue
        key, _, row = heapq.heappop(ready)
        yield key, row


def _whole_layers_bottleneck(layer_s: np.ndarray, start: np.ndarray, most: np.ndarray,
                             least: np.ndarray, needed: int) -> np.ndarray:
    """Per pipeline (all axes of `layer_s` but the last, which runs over its stages), the
    least stage time t at which its stages hold `needed` layers: the stage with mean layer
    time s, busy for `start` before them (transfers, a layer of its own), holding
    floor((t - start) / s) of them and no more than `most`, t long enough for `least` of
    them; infinite where no t does (padding stages: s infinite, the rest 0)."""
    real = np.isfinite(layer_s)
    finite_s = np.where(real, layer_s, 0.0)
    low = np.where(real, start + least * finite_s, 0.0).max(axis=-1)
    high = low + finite_s.max(axis=-1) * max(needed, 1)  # every stage holding them all
    per_s = (1 + 1e-12) / layer_s  # padding: 0
    offset = np.where(real, start * per_s, 0.0)

    def held(t: np.ndarray) -> np.ndarray:
        return np.minimum(np.floor(t[..., None] * per_s - offset), most)

    def covered(t: np.ndarray) -> np.ndarray:
        return held(t).sum(axis=-1)

    possible = covered(high) >= needed
    low, high = _bisected(low, high, lambda t: covered(t) >= needed)
    # The interval left is narrower than a step of most stages: the least t is where the
    # stage that last took a layer took it (exact, but where steps are closer than that).
    took = np.where(real, start + np.maximum(held(high), 0.0) * finite_s, 0.0).max(axis=-1)
    return np.where(possible, np.clip(took, low, high), np.inf)


def _bisected(low: np.ndarray, high: np.ndarray, enough: Callable[[np.ndarray], np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray]:
    """[low, high] halved BISECTIONS times about where `enough` (monotone in t) turns true:
    false at low (or low a bound below), true at high."""
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        done = enough(mid)
        high = np.where(done, mid, high)
        low = np.where(done, low, mid)
    return low, high


def _class_orders(tables: ScenarioTables, grid: _Grid
                  ) -> list[tuple[tuple[ResourceClass, int, int], ...]]:
    """(class, tp, stages) of the grid's classes in each order its replicas try
    (`_order_indices`)."""
    keys = [(c, tp, s) for c, tp, s in zip(grid.classes, grid.tp, grid.stages, strict=True)]
    return [tuple(keys[i] for i in order) for order in _order_indices(tables, grid.classes)]


def _order_indices(tables: ScenarioTables, classes: Sequence[ResourceClass]
                   ) -> list[tuple[int, ...]]:
    """Orders of `classes` (their indices, front first) that a grid's replicas try: every
    order, or with MAX_ORDERS_FROM classes and more, a few: by memory both ways; where the
    sweeps are cheap (`_widened`), also by speed both ways and each class in front of the
    others in memory order; and, over several zones, zone by zone (memory order within
    each), the zones both ways."""
    count = len(classes)
    if count < MAX_ORDERS_FROM:
        return list(itertools.permutations(range(count)))
    by_memory = tuple(sorted(range(count),
                             key=lambda i: -tables.capacity_bytes[classes[i].gpu_type]))
    orders = [by_memory, by_memory[::-1]]
    if _widened(tables):
        # The front stages hold the most micro-batches in flight, and a class's place sets
        # the links its transfers cross: memory order alone missed grids up to 7.6% faster
        # on held-out inputs of four types or two zones. (On the six-type input at 480 GPUs
        # these orders cost 23% of its planning time for a plan 1.6% faster.)
        speed = tables.least_compute_s
        by_speed = tuple(sorted(range(count), key=lambda i: speed[classes[i].gpu_type]))
        orders += [by_speed, by_speed[::-1]]
        orders += [(i, *(j for j in by_memory if j != i)) for i in by_memory]
    zones = sorted({c.zone or "" for c in classes})
    if len(zones) >= 2:
        # Memory order alone may cross between zones at every stage boundary: each zone's
        # classes together, the zones in either order, cross a slow link once.
        for ordered_zones in (zones, zones[::-1]):
            rank = {z: k for k, z in enumerate(ordered_zones)}
            orders.append(tuple(sorted(by_memory, key=lambda i: rank[classes[i].zone or ""])))
    return list(dict.fromkeys(orders))



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
