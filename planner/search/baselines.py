"""The three baselines a user compares hetplan against.

- `homogeneous` (docs/formats.md, bounds and baselines): one GPU type, identical pipelines,
  even layer split: what a homogeneous launcher does.
- `unaware` (section 5): every GPU, identical pipelines, even split: what a
  heterogeneity-unaware launcher does.
- `per_type`: what a careful engineer builds by hand: the best homogeneous
  pipelines of each GPU type with exact layer splits, and the batch balanced
  across them by speed.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Iterator

from planner.search.drafts import (
    Candidate,
    Draft,
    Replicas,
    best_realized,
    contending_replicas,
    draft,
)
from planner.search.per_type import class_options, per_type_choices
from planner.search.tables import ResourceClass, ScenarioTables
from planner.search.templates import StageShape, TemplateContext, even_bounds

__all__ = ["as_per_type", "launcher_baselines", "per_type_candidates"]

KEEP = 6  # drafts of each baseline handed to the full estimator


def launcher_baselines(tables: ScenarioTables) -> dict[str, list[Candidate]]:
    """Placed candidates of the `homogeneous` and `unaware` baselines, best first by the quick
    estimate."""
    ctx = TemplateContext(tables, tables.scenario.job.schedule)
    return {name: best_realized(tables, contending_replicas(tables, offers, KEEP), KEEP)
            for name, offers in (("homogeneous", _homogeneous(ctx)), ("unaware", _unaware(ctx)))}


def per_type_candidates(tables: ScenarioTables) -> list[Candidate]:
    """Placed candidates of the `per_type` baseline, best first by the quick estimate. One
    type's identical pipelines with an even split are per-type plans too: `as_per_type`
    adds the homogeneous baseline's, so that `per_type` is never below it."""
    return best_realized(tables, _per_type(TemplateContext(tables, tables.scenario.job.schedule)),
                         KEEP)


def as_per_type(homogeneous: Candidate) -> Candidate:
    return Candidate(build=homogeneous.build, quick_s=homogeneous.quick_s,
                     known_depths=homogeneous.known_depths, pipelines=homogeneous.pipelines,
                     origin=homogeneous.origin.replace("homogeneous baseline",
                                                       "per-type baseline (one type)"))


def _shapes(tables: ScenarioTables) -> Iterator[tuple[int, int]]:
    """(micro_batch, tp) points profiled for the model's kinds on some type."""
    yield from sorted({(b, tp) for (_, b, tp) in tables.points})


def _homogeneous(ctx: TemplateContext) -> Iterator[Replicas]:
    tables = ctx.tables
    by_type: dict[str, list[ResourceClass]] = {}
    for cls in tables.classes:
        by_type.setdefault(cls.gpu_type, []).append(cls)
    for gpu_type, classes in by_type.items():
        cls = max(classes, key=lambda c: c.num_gpus)  # one zone: rings stay off slow links
        for b, tp in _shapes(tables):
            if (gpu_type, b, tp) not in tables.points or tp > cls.largest_node:
                continue
            shape = StageShape(resource=cls.key, tp=tp)
            # Every micro-batch passes every layer, and some stage of an even split holds at
            # least 1/depth of the compute: no pipeline of m micro-batches takes less than
            # max(1, m / depth) times the whole model's.
            whole_s = float(tables.points[(gpu_type, b, tp)].compute_s[-1])
            for depth in range(1, min(tables.max_stages, cls.slots(tp)) + 1):
                most = cls.slots(tp) // depth
                # Under ZeRO the state shrinks with the number of pipelines: check at the most.
                yield Replicas(
                    build=functools.partial(ctx.even_run, shape, b, depth,
                                            same_node_links=depth * tp <= cls.largest_node,
                                            num_pipelines=max(most, 1)),
                    micro_batch=b, counts=range(most, 0, -1),
                    origin=f"homogeneous baseline ({gpu_type})",
                    floor_s=functools.partial(_floor_s, whole_s, depth))


def _floor_s(whole_s: float, depth: int, num_micro_batches: int) -> float:
    return max(1.0, num_micro_batches / depth) * whole_s


def _unaware(ctx: TemplateContext) -> Iterator[Replicas]:
    """Identical pipelines over every GPU: each takes the same share of every class."""
    tables = ctx.tables
    gpus = Counter({c.key: c.num_gpus for c in tables.classes})
    for b, tp in _shapes(tables):
        if any((key[0], b, tp) not in tables.points for key in gpus):
            continue
        if any(tp > c.largest_node for c in tables.classes):
            continue
        for n in range(1, sum(gpus.values()) // tp + 1):
            if any(count % (n * tp) for count in gpus.values()):
                continue
            per_pipeline = {key: count // (n * tp) for key, count in gpus.items()}
            depth = sum(per_pipeline.values())
            if depth > tables.max_stages:
                continue
            for order in _type_orders(tables, list(per_pipeline)):
                shapes = [StageShape(resource=key, tp=tp)
                          for key in order for _ in range(per_pipeline[key])]
                fits_node = all(per_pipeline[c.key] * tp <= c.largest_node for c in tables.classes)
                yield Replicas(
                    build=functools.partial(ctx.fixed, shapes, b,
                                            even_bounds(tables.num_layers, depth),
                                            same_node_links=fits_node, num_pipelines=n),
                    micro_batch=b, counts=[n], origin="unaware baseline")


def _type_orders(
    tables: ScenarioTables, keys: list[tuple[str, str | None]]
) -> list[tuple[tuple[str, str | None], ...]]:
    if len(keys) <= 3:
        return list(itertools.permutations(keys))
    memory = tables.capacity_bytes
    by_memory = sorted(keys, key=lambda k: -memory[k[0]])
    return [tuple(by_memory), tuple(reversed(by_memory))]


def _per_type(ctx: TemplateContext) -> Iterator[Draft | None]:
    """Homogeneous pipelines per class, side by side, the batch split by speed."""
    tables = ctx.tables
    options = [class_options(ctx, cls) for cls in tables.classes]
    for chosen in per_type_choices(tables, options):
        pipelines = [o.template for o in chosen.picks for _ in range(o.copies)]
        # Ranked for placement by the choice's own sync estimate, which counts the
        # interfaces copies placed node-aligned leave free (the rough one counts every node
        # used whole: on a held-out input it put the set the choice ranked first, 1.6%
        # faster once placed, below the sets judged).
        yield draft(tables, pipelines, "per-type baseline", sync_s=chosen.sync_s)
