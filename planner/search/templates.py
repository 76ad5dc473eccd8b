"""Pipeline templates: a shape of stages with its optimal layer split.

A template fixes the micro-batch size, each stage's resource class (GPU type
and zone) and tensor-parallel degree, and holds the exact partition of layers
over them. Homogeneous templates use one class; two-segment templates put one
class in front of another (memory-rich or fast GPUs first, slow or small ones
behind), which is what per-type data parallelism cannot express.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.costs import zone_link
from planner.documents import Schedule
from planner.search.partition import (
    LinkCost,
    Partition,
    StageSpec,
    SuffixSweep,
    extract_light_together,
    fixed_partition,
    sweep_together,
)
from planner.search.tables import ResourceClass, ScenarioTables

__all__ = [
    "StageShape", "PipelineTemplate", "generate_templates", "TemplateLimits", "TemplateContext",
    "even_bounds", "homogeneous_templates", "rings_s", "stages_per_node",
    "template_from_partition",
]

ClassKey = tuple[str, str | None]


class StageShape(NamedTuple):
    # A tuple: hashed in C, and templates hash and count their stages many times.
    resource: ClassKey
    tp: int

    @property
    def gpu_type(self) -> str:
        return self.resource[0]


@dataclass(frozen=True, kw_only=True)
class TemplateLimits:
    max_stages: int = 64
    """Deepest pipeline considered."""
    max_points_per_class: int = 2
    """(micro_batch, tp) points per class kept for two-segment templates..."""
    every_point_up_to_gpus: int = 16
    """... but every profiled point on fleets of at most this many GPUs (the sizes exact
    mode takes), where two-segment templates are few and cheap: with few micro-batches a
    slower point often wins there (a larger tp, fewer stages to fill; an A100 tp2 behind an
    H100), and the search should not need the enumeration to find it."""
    tail_stage_counts: tuple[int, ...] = (1, 2, 4, 8)
    """Stage counts of the back segment of two-segment templates."""


@dataclass(frozen=True, kw_only=True, eq=False)
class PipelineTemplate:
    micro_batch: int
    stages: tuple[StageShape, ...]
    partition: Partition
    fill_s: float
    """Time of one micro-batch through every stage and transfer."""
    max_micro_batches: int | None
    """GPipe keeps every micro-batch in flight: the most that fit. None: no limit."""
    sync_parts: tuple[tuple[float, float], ...]
    """Per stage: (seconds of gradient bytes over the ring, seconds of latency per ring step)."""
    transfer_s: tuple[float, ...] = ()
    """Per boundary between stages: one transfer's seconds as the split priced it (empty:
    not known)."""
    # Derived once, when built: the search asks these of thousands of templates, many times.
    bottleneck_s: float = field(init=False)
    num_gpus: int = field(init=False)
    stage_counts: Counter[StageShape] = field(init=False, repr=False)
    """Stages of each shape (do not mutate)."""
    _gpus: dict[ClassKey, int] = field(init=False, repr=False)
    _sync_cache: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    simulated: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    """Event-simulated time by number of micro-batches, where a draft asked for it
    (`drafts.pipeline_s`)."""
    _usage: tuple[Mapping[ClassKey, Sequence[int]], dict[tuple[ClassKey, int], int]] | None = (
        field(init=False, repr=False, default=None))

    def __post_init__(self) -> None:
        counts = Counter(self.stages)
        gpus: dict[ClassKey, int] = {}
        for shape, count in counts.items():
            gpus[shape.resource] = gpus.get(shape.resource, 0) + shape.tp * count
        derive = functools.partial(object.__setattr__, self)  # frozen: set once, here
        derive("bottleneck_s", self.partition.bottleneck_s)
        derive("num_gpus", sum(gpus.values()))
        derive("stage_counts", counts)
        derive("_gpus", gpus)

    @property
    def signature(self) -> tuple[int, tuple[StageShape, ...], tuple[int, ...]]:
        """Micro-batch size, stages and layer split: templates equal in these are equal."""
        return (self.micro_batch, self.stages, self.partition.bounds)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def gpus(self) -> dict[ClassKey, int]:
        """GPUs used per class (do not mutate)."""
        return self._gpus

    def time_s(self, num_micro_batches: int) -> float:
        """1F1B/GPipe time of one pipeline: fill, then one bottleneck per further micro-batch."""
        return self.fill_s + (num_micro_batches - 1) * self.bottleneck_s

    def sync_s(self, num_pipelines: int) -> float:
        """Sync time if all `num_pipelines` rings ran at this template's class links."""
        n = num_pipelines
        if n <= 1:
            return 0.0
        cache = self._sync_cache
        if n not in cache:
            cache[n] = rings_s(self.sync_parts, n)
        return cache[n]

    def usage(
        self, levels: Mapping[ClassKey, Sequence[int]]
    ) -> dict[tuple[ClassKey, int], int]:
        """Non-zero GPUs of each (class, tp level) row used by stages of at least that tp,
        given each class's levels. Cached for the levels of one search (by identity): the
        allocation asks at every knapsack."""
        known = self._usage
        if known is None or known[0] is not levels:
            usage: dict[tuple[ClassKey, int], int] = {}
            for shape, count in self.stage_counts.items():
                for level in levels[shape.resource]:
                    if level <= shape.tp:
                        row = (shape.resource, level)
                        usage[row] = usage.get(row, 0) + shape.tp * count
            known = (levels, usage)
            object.__setattr__(self, "_usage", known)
        return known[1]


def rings_s(parts: Iterable[tuple[float, float]], n: int) -> float:
    """The longest of the stages' sync rings among `n` holders, each given as (seconds of its
    gradient bytes over its ring's link, seconds of latency per ring step)."""
    return max([2 * (n - 1) / n * data + 2 * (n - 1) * lat for data, lat in parts])


class TemplateContext:
    """What every template of one search is built from: the tables, the schedule, and
    memoised links and stage specs (the same few are asked for thousands of times)."""

    def __init__(self, tables: ScenarioTables, schedule: Schedule) -> None:
        self.tables = tables
        self.scenario = tables.scenario
        self.schedule = schedule
        self.blocking = self.scenario.job.blocking_transfers
        self.by_key = {c.key: c for c in tables.classes}
        self._rings: dict[ClassKey, tuple[float, float]] = {}
        self._links: dict[tuple[ClassKey, ClassKey, bool], LinkCost] = {}
        self._runs: dict[tuple[StageShape, int, LinkCost], list[StageSpec]] = {}

    def link(self, front: ClassKey, back: ClassKey, *, same_node: bool) -> LinkCost:
        key = (front, back, same_node)
        if key not in self._links:
            if same_node:
                link = self.scenario.cluster.intra_node[front[0]]
            else:
                link = zone_link(self.scenario, front[1], back[1])
            self._links[key] = LinkCost(latency_s=link.latency_us * 1e-6,
                                        bytes_per_s=link.bandwidth_gb_per_s * 1e9)
        return self._links[key]

    def ring(self, resource: ClassKey) -> tuple[float, float]:
        """(bytes/s, latency s) of a sync ring among holders of one class on different nodes."""
        if resource not in self._rings:
            nodes = self.by_key[resource].nodes
            share = min(min(1.0, n.num_nics / n.gpus) for n in nodes)
            link = self.scenario.cluster.inter_node
            self._rings[resource] = (link.bandwidth_gb_per_s * 1e9 * share, link.latency_us * 1e-6)
        return self._rings[resource]

    def in_flight(self, b: int, k: int) -> int:
        """Micro-batches the stage k-th from the end keeps, as the layer DP counts them:
        1F1B keeps min(S - s, m), m at most the batch over b."""
        if self.schedule is not Schedule.ONE_F_ONE_B:
            return 1
        return min(k, -(-self.scenario.job.global_batch_size // b))

    def stage_spec(self, shape: StageShape, b: int, k: int, link_in: LinkCost | None) -> StageSpec:
        point = self.tables.points[(shape.gpu_type, b, shape.tp)]
        return StageSpec(point=point, in_flight=self.in_flight(b, k), link_in=link_in)

    def fixed(
        self,
        stages: list[StageShape],
        b: int,
        bounds: list[int],
        *,
        same_node_links: bool = False,
        num_pipelines: int = 1,
    ) -> PipelineTemplate | None:
        """A template with a given layer split (the even splits of the baselines)."""
        tables = self.tables
        if any((s.gpu_type, b, s.tp) not in tables.points for s in stages):
            return None
        if all(s == stages[0] for s in stages):
            specs = self._run(stages[0], b, len(stages), same_node_links)[:len(stages)]
            return self._split(specs, stages, b, bounds, num_pipelines)
        depth = len(stages)

        def spec(k: int) -> StageSpec:
            shape = stages[depth - k]
            front = stages[depth - k - 1] if k < depth else shape
            same = same_node_links and front.resource == shape.resource
            return self.stage_spec(shape, b, k, self.link(front.resource, shape.resource,
                                                          same_node=same))

        if not self._first_stage_fits(spec(depth), bounds[1], num_pipelines):
            return None
        return self._split([spec(k) for k in range(1, depth + 1)], stages, b, bounds,
                           num_pipelines)

    def even_run(
        self, shape: StageShape, b: int, depth: int, *, same_node_links: bool, num_pipelines: int
    ) -> PipelineTemplate | None:
        """`depth` stages of one shape over an even split (what a homogeneous launcher runs).
        Cheaper than `fixed` for a failing depth: no stage list or split is built first."""
        link = self.link(shape.resource, shape.resource, same_node=same_node_links)
        base, extra = divmod(self.tables.num_layers, depth)
        if not self._first_stage_fits(self.stage_spec(shape, b, depth, link),
                                      base + (extra > 0), num_pipelines):
            return None
        return self._split(self._run(shape, b, depth, same_node_links)[:depth], [shape] * depth,
                           b, even_bounds(self.tables.num_layers, depth), num_pipelines)

    def _first_stage_fits(self, first: StageSpec, end: int, num_pipelines: int) -> bool:
        """Whether a split's first stage fits over layers [0, end). It keeps the most
        micro-batches in flight, and the baselines ask for thousands of splits, most too
        deep or too shallow to fit: checked before the other stages are even built."""
        return fixed_partition(self.tables, [first], [0, end], blocking=self.blocking,
                               num_pipelines=num_pipelines) is not None

    def _run(
        self, shape: StageShape, b: int, depth: int, same_node_links: bool
    ) -> list[StageSpec]:
        """Specs of at least `depth` stages of one shape, counted from the end (memoised per
        shape: do not mutate)."""
        link = self.link(shape.resource, shape.resource, same_node=same_node_links)
        run = self._runs.setdefault((shape, b, link), [])
        while len(run) < depth:
            run.append(self.stage_spec(shape, b, len(run) + 1, link))
        return run

    def _split(
        self, specs: list[StageSpec], stages: list[StageShape], b: int, bounds: list[int],
        num_pipelines: int,
    ) -> PipelineTemplate | None:
        part = fixed_partition(self.tables, specs, bounds, blocking=self.blocking,
                               num_pipelines=num_pipelines)
        if part is None:
            return None
        return template_from_partition(self, specs, part, b, stages)


def even_bounds(num_layers: int, num_stages: int) -> list[int]:
    """Layers split as evenly as possible, earlier stages taking the extra ones."""
    base, extra = divmod(num_layers, num_stages)
    return [s * base + min(s, extra) for s in range(num_stages + 1)]


def generate_templates(
    tables: ScenarioTables,
    schedule: Schedule,
    *,
    num_pipelines_hint: int = 1,
    limits: TemplateLimits | None = None,
    two_segment: bool = True,
) -> list[PipelineTemplate]:
    """Homogeneous templates of every class, depth and profiled point, then (unless told
    not to) two-segment ones."""
    limits = limits or TemplateLimits()
    ctx = TemplateContext(tables, schedule)
    homogeneous = list(_homogeneous(ctx, num_pipelines_hint, limits))
    if not two_segment:
        return homogeneous
    small = tables.num_gpus <= limits.every_point_up_to_gpus
    best_points = _best_points(ctx, homogeneous,
                               len(tables.points) if small else limits.max_points_per_class)
    deepest = _deepest_useful(homogeneous)
    mixed = list(_two_segment(ctx, best_points, deepest, num_pipelines_hint, limits))
    return homogeneous + mixed


def _points(ctx: TemplateContext, cls: ResourceClass) -> Iterator[tuple[int, int]]:
    for (gpu_type, b, tp) in ctx.tables.points:
        if gpu_type == cls.gpu_type and tp <= cls.largest_node:
            yield b, tp


def _homogeneous(
    ctx: TemplateContext, num_pipelines: int, limits: TemplateLimits
) -> Iterator[PipelineTemplate]:
    """The allocation's homogeneous templates: one sweep per point, its stages sharing a
    node while the run fits in one, the depths that cut the bottleneck. (The per-type
    baseline prices node crossings where placement puts them and keeps every depth:
    `homogeneous_templates`. Offered to the allocation too, those templates moved its
    linear model to worse mixed plans on the shared scenarios: measured, not kept.)"""
    for cls in ctx.tables.classes:
        for b, tp in _points(ctx, cls):
            shape = StageShape(resource=cls.key, tp=tp)
            max_stages = min(limits.max_stages, cls.slots(tp), ctx.tables.max_stages)
            sweep = SuffixSweep(ctx.tables, blocking=ctx.blocking, num_pipelines=num_pipelines)
            sweep_together([sweep], [functools.partial(_run_spec, ctx, cls, shape, b, 0)],
                           [max_stages])
            yield from _useful_depths(ctx, sweep, 1, b, functools.partial(_segments, shape, None, 0))


def homogeneous_templates(
    ctx: TemplateContext,
    cls: ResourceClass,
    *,
    num_pipelines: int = 1,
    limits: TemplateLimits | None = None,
) -> list[PipelineTemplate]:
    """Pipelines of one class at every profiled point and depth that fits, with their
    least-bottleneck splits (of those, the lightest heaviest stage), transfers priced
    across nodes where placement cuts a pipeline. Swept once per search."""
    limits = limits or TemplateLimits()
    key = ("homogeneous", cls.key, num_pipelines, limits.max_stages)
    every = ctx.tables.matrices.get(key)
    if every is None:
        every = ctx.tables.matrices[key] = list(_every_depth(ctx, cls, num_pipelines, limits))
    assert isinstance(every, list)
    return list(every)


def _every_depth(
    ctx: TemplateContext, cls: ResourceClass, num_pipelines: int, limits: TemplateLimits
) -> Iterator[PipelineTemplate]:
    # State sharded over several pipelines fits deeper; where memory did not bind, the
    # split is the unsharded one's, which is valid at any pipeline count: not made twice.
    unsharded = {} if num_pipelines == 1 else {
        (t.micro_batch, t.stages[0].tp, t.num_stages): t.bottleneck_s
        for t in homogeneous_templates(ctx, cls, limits=limits)}
    for b, tp in _points(ctx, cls):
        shape = StageShape(resource=cls.key, tp=tp)
        max_stages = min(limits.max_stages, cls.slots(tp), ctx.tables.max_stages)
        # Pipelines are placed stage after stage, node after node: a transfer crosses nodes
        # after every `per_node` stages from the front. Counted from the end, as the DP
        # sweeps, that pattern depends on the depth modulo `per_node`: one sweep each.
        local = ctx.schedule is Schedule.LOCAL
        per_node = stages_per_node(cls, tp, ctx.schedule)
        inside = ctx.link(cls.key, cls.key, same_node=True)
        across = ctx.link(cls.key, cls.key, same_node=False)
        residues = range(min(per_node, max_stages))
        sweeps = [SuffixSweep(ctx.tables, blocking=ctx.blocking, num_pipelines=num_pipelines)
                  for _ in residues]
        sweep_together(sweeps, [functools.partial(_aligned_spec, ctx, shape, b, per_node, r,
                                                  inside, across) for r in residues],
                       [max_stages for _ in residues])
        wanted = [[d for d in range(1, min(max_stages, len(sweep.specs)) + 1)
                   if d % len(sweeps) == r
                   and unsharded.get((b, tp, d)) != sweep.depth_bottleneck(d)]
                  for r, sweep in enumerate(sweeps)]
        parts: dict[int, Partition | None] = {}
        if local:  # any least-bottleneck split: the shared split replaces it
            parts = {d: sweeps[r].extract(d) for r, ds in enumerate(wanted) for d in ds}
        else:
            for found in extract_light_together(sweeps, wanted):
                parts.update(found)
        for depth in sorted(parts):
            part = parts[depth]
            if part is not None:
                template = template_from_partition(ctx, sweeps[depth % len(sweeps)].specs, part,
                                                    b, _segments(shape, None, 0, depth))
                if template is not None:
                    yield template


def stages_per_node(cls: ResourceClass, tp: int, schedule: Schedule) -> int:
    """Stages at `tp` that the every-depth templates of `cls` put on a node before a transfer
    crosses to the next (1: every transfer priced across nodes). Under `local` these splits
    only rank depths, points and counts: the shared split replaces them, and the estimator
    judges every plan. One sweep prices every transfer across nodes there (on 83 local
    inputs no plan was slower, three 0.1-0.3% faster, and the child's sweeps took half the
    time)."""
    if tp * 2 > cls.largest_node or schedule is Schedule.LOCAL:
        return 1
    return cls.largest_node // tp


def _aligned_spec(ctx: TemplateContext, shape: StageShape, b: int, per_node: int, residue: int,
                  inside: LinkCost, across: LinkCost, k: int) -> StageSpec:
    """The k-th stage from the end of a pipeline whose depth is `residue` modulo `per_node`:
    it receives across nodes when it starts a node."""
    return ctx.stage_spec(shape, b, k, across if k % per_node == residue else inside)


def _run_spec(
    ctx: TemplateContext, cls: ResourceClass, shape: StageShape, b: int, num_behind: int, k: int
) -> StageSpec:
    """The k-th stage from the end of a run of `shape` stages in front of `num_behind`
    others. Consecutive stages share a node while the run fits in one (with one more
    stage's room when it feeds another segment)."""
    inner = (shape.tp * 2 <= cls.largest_node
             and (k + (num_behind > 0)) * shape.tp <= cls.largest_node)
    link = ctx.link(cls.key, cls.key, same_node=inner)
    return ctx.stage_spec(shape, b, num_behind + k, link)


def _best_points(
    ctx: TemplateContext, homogeneous: list[PipelineTemplate], keep: int
) -> dict[ClassKey, list[tuple[int, int]]]:
    """Per class, the (micro_batch, tp) points of most samples per GPU-second: the best of
    its homogeneous pipelines, and the best on compute alone (a class too small or too
    memory-poor to hold the model by itself has no homogeneous pipeline, yet may be the
    right home for a few stages)."""
    by_pipeline: dict[ClassKey, list[tuple[float, int, int]]] = {}
    for t in homogeneous:
        rate = t.micro_batch / t.bottleneck_s / t.num_gpus
        by_pipeline.setdefault(t.stages[0].resource, []).append((rate, t.micro_batch, t.stages[0].tp))
    by_compute: dict[ClassKey, list[tuple[float, int, int]]] = {}
    for cls in ctx.tables.classes:
        for b, tp in _points(ctx, cls):
            costs = ctx.tables.points[(cls.gpu_type, b, tp)]
            by_compute.setdefault(cls.key, []).append((b / (tp * float(costs.compute_s[-1])), b, tp))
    chosen: dict[ClassKey, list[tuple[int, int]]] = {}
    for ranking in (by_pipeline, by_compute):
        for key, scored in ranking.items():
            best: dict[tuple[int, int], float] = {}
            for rate, b, tp in scored:
                best[(b, tp)] = max(rate, best.get((b, tp), 0.0))
            picks = chosen.setdefault(key, [])
            for pick in sorted(best, key=lambda p: -best[p])[:keep]:
                if pick not in picks:
                    picks.append(pick)
    return chosen


def _deepest_useful(templates: list[PipelineTemplate]) -> dict[tuple[ClassKey, int, int], int]:
    """Per (class, micro_batch, tp): the deepest homogeneous pipeline that still paid off."""
    deepest: dict[tuple[ClassKey, int, int], int] = {}
    for t in templates:
        key = (t.stages[0].resource, t.micro_batch, t.stages[0].tp)
        deepest[key] = max(deepest.get(key, 0), t.num_stages)
    return deepest


def _two_segment(
    ctx: TemplateContext,
    best_points: dict[ClassKey, list[tuple[int, int]]],
    deepest: dict[tuple[ClassKey, int, int], int],
    num_pipelines: int,
    limits: TemplateLimits,
) -> Iterator[PipelineTemplate]:
    classes = ctx.tables.classes
    tails: list[_Tail] = []
    backs: dict[tuple[ClassKey, int, int], tuple[SuffixSweep, int]] = {}
    for back in classes:
        for front in classes:
            if front.key == back.key:
                continue
            for b, tp_back in best_points.get(back.key, []):
                front_tps = sorted({tp for bb, tp in best_points.get(front.key, []) if bb == b})
                front_tps = [tp for tp in front_tps if (front.gpu_type, b, tp) in ctx.tables.points]
                if not front_tps:
                    continue
                if (back.key, b, tp_back) not in backs:  # the same behind every front
                    backs[(back.key, b, tp_back)] = _back_segments(
                        ctx, back, b, tp_back, num_pipelines, limits)
                sweep, usable = backs[(back.key, b, tp_back)]
                tails += _tails(ctx, front, back, b, tp_back, front_tps, sweep, usable, deepest,
                                limits)
    # Front segments of one shape, behind any tail, push stages of the same costs:
    # swept side by side.
    same_front: dict[tuple[ClassKey, int, StageShape], list[_Tail]] = {}
    for tail in tails:
        same_front.setdefault((tail.front.key, tail.b, tail.front_shape), []).append(tail)
    for group in same_front.values():
        sweep_together(
            [t.sweep for t in group],
            [functools.partial(_run_spec, ctx, t.front, t.front_shape, t.b, t.num_back)
             for t in group],
            [t.max_front for t in group])
    for tail in tails:
        yield from _useful_depths(
            ctx, tail.sweep, tail.num_back + 1, tail.b,
            functools.partial(_segments, tail.front_shape, tail.back_shape, tail.num_back))


@dataclass(frozen=True, kw_only=True)
class _Tail:
    """A back segment swept, ready for a front segment of `front_shape` stages."""

    sweep: SuffixSweep
    front: ResourceClass
    front_shape: StageShape
    back_shape: StageShape
    b: int
    num_back: int
    max_front: int


def _back_segments(
    ctx: TemplateContext,
    back: ResourceClass,
    b: int,
    tp_back: int,
    num_pipelines: int,
    limits: TemplateLimits,
) -> tuple[SuffixSweep, int]:
    """The back stages of two-segment pipelines, swept once for every front class, and how
    many of them a front stage can still be put before."""
    back_shape = StageShape(resource=back.key, tp=tp_back)
    max_back = min(max(limits.tail_stage_counts), back.slots(tp_back), ctx.tables.max_stages - 1)
    sweep = SuffixSweep(ctx.tables, blocking=ctx.blocking, num_pipelines=num_pipelines)
    for num_back in range(1, max_back + 1):
        inner = (num_back + 1) * tp_back <= back.largest_node and tp_back * 2 <= back.largest_node
        sweep.push(ctx.stage_spec(back_shape, b, num_back, ctx.link(back.key, back.key,
                                                                     same_node=inner)))
        if not sweep.extendable():  # no front stage fits before these, nor before more
            return sweep, num_back - 1
    return sweep, max_back


def _tails(
    ctx: TemplateContext,
    front: ResourceClass,
    back: ResourceClass,
    b: int,
    tp_back: int,
    front_tps: list[int],
    backs: SuffixSweep,
    usable: int,
    deepest: dict[tuple[ClassKey, int, int], int],
    limits: TemplateLimits,
) -> list[_Tail]:
    back_shape = StageShape(resource=back.key, tp=tp_back)
    crossing = ctx.link(front.key, back.key, same_node=False)
    tails = []
    for num_back in sorted({n for n in limits.tail_stage_counts if n <= usable}):
        for tp_front in front_tps:
            max_front = min(limits.max_stages - num_back, front.slots(tp_front),
                            ctx.tables.max_stages - num_back,
                            deepest.get((front.key, b, tp_front), 1) + 1)
            # The last back stage kept receives from the front segment over `crossing`.
            tails.append(_Tail(sweep=backs.branch(crossing, keep=num_back), front=front,
                               front_shape=StageShape(resource=front.key, tp=tp_front),
                               back_shape=back_shape, b=b, num_back=num_back,
                               max_front=max_front))
    return tails


def _segments(
    front: StageShape, back: StageShape | None, num_back: int, depth: int
) -> list[StageShape]:
    """Stages of a pipeline `depth` deep: the front shape, then `num_back` of the back shape."""
    tail = [back] * num_back if back is not None else []
    return [front] * (depth - num_back) + tail


IMPROVEMENT = 0.98
"""A deeper pipeline is worth its GPUs only if its bottleneck is at least 2% lower."""


def _useful_depths(
    ctx: TemplateContext,
    sweep: SuffixSweep,
    first_depth: int,
    b: int,
    stages_of: Callable[[int], list[StageShape]],
) -> Iterator[PipelineTemplate]:
    """Templates of the depths swept from `first_depth` on that pay off."""
    best = math.inf
    for depth in range(first_depth, len(sweep.specs) + 1):
        bottleneck = sweep.depth_bottleneck(depth)
        if bottleneck < best * IMPROVEMENT:
            template = _template(ctx, sweep, depth, b, stages_of(depth))
            if template is not None:
                best = bottleneck
                yield template


def _template(
    ctx: TemplateContext, sweep: SuffixSweep, depth: int, b: int, stages: list[StageShape]
) -> PipelineTemplate | None:
    if not math.isfinite(sweep.depth_bottleneck(depth)):
        return None
    part = sweep.extract(depth)
    if part is None:
        return None
    return template_from_partition(ctx, sweep.specs, part, b, stages)


def template_from_partition(
    ctx: TemplateContext, specs: list[StageSpec], part: Partition, b: int, stages: list[StageShape]
) -> PipelineTemplate | None:
    """The template of `stages` split by `part`, whose stages were swept as `specs`
    (counted from the end); None where GPipe could keep no micro-batch in flight."""
    depth = len(stages)
    tables = ctx.tables
    # One transfer per boundary, as the split priced it; without blocking, they delay the
    # fill instead of occupying stages.
    transfers = []
    for s in range(depth - 1):
        link = specs[depth - s - 2].link_in
        assert link is not None
        transfers.append(link.latency_s + tables.output_at[part.bounds[s + 1] - 1] * b
                         / link.bytes_per_s)
    fill = sum(part.stage_s)
    if not ctx.blocking:
        for transfer in transfers:
            fill += 2 * transfer
    max_m = _gpipe_limit(ctx, part, stages, b) if ctx.schedule is Schedule.GPIPE else None
    if max_m is not None and max_m < 1:
        return None
    grad_bytes = ctx.scenario.job.grad_bytes
    params_at, bounds = ctx.tables.params_at, part.bounds
    rings = {shape: (shape.tp, *ctx.ring(shape.resource)) for shape in dict.fromkeys(stages)}
    sync_parts = tuple(
        ((params_at[end] - params_at[start]) * grad_bytes / tp / bandwidth, latency * (end - start))
        for start, end, (tp, bandwidth, latency)
        in zip(bounds[:-1], bounds[1:], map(rings.__getitem__, stages), strict=True))
    return PipelineTemplate(
        micro_batch=b, stages=tuple(stages), partition=part, fill_s=fill,
        max_micro_batches=max_m, sync_parts=sync_parts, transfer_s=tuple(transfers))


def _gpipe_limit(ctx: TemplateContext, part: Partition, stages: list[StageShape], b: int) -> int:
    tables = ctx.tables
    limit = 10**9
    for s, shape in enumerate(stages):
        start, end = part.bounds[s], part.bounds[s + 1]
        point = tables.points[(shape.gpu_type, b, shape.tp)]
        state = tables.state_bytes(start, end, shape.tp, 1)
        acts = float(point.activation_bytes[end] - point.activation_bytes[start])
        room = tables.capacity_bytes[shape.gpu_type] - state
        limit = min(limit, int(room // acts) if acts > 0 else 10**9)
    return limit
