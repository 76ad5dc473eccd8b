"""The three baselines a user compares hetplan against.

- `homogeneous` (COST_MODEL.md section 5): one GPU type, identical pipelines,
  even layer split: what a homogeneous launcher does.
- `unaware` (section 5): every GPU, identical pipelines, even split: what a
  heterogeneity-unaware launcher does.
- `per_type`: what a careful engineer builds by hand: the best homogeneous
  pipelines of each GPU type with exact layer splits, and the batch balanced
  across them by speed.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

from planner.documents import Schedule
from planner.search.api import Candidate, assemble
from planner.search.assemble import PlacementStyle, build_plan, place
from planner.search.quick import estimate_sync_s
from planner.search.tables import ResourceClass, ScenarioTables
from planner.search.templates import PipelineTemplate, StageShape, fixed_template

__all__ = ["even_bounds", "baseline_candidates"]

KEEP = 3  # candidates of each baseline handed to the full estimator


def even_bounds(num_layers: int, num_stages: int) -> list[int]:
    """Layers split as evenly as possible, earlier stages taking the extra ones."""
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for s in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return bounds


def baseline_candidates(
    tables: ScenarioTables, templates: list[PipelineTemplate]
) -> dict[str, list[Candidate]]:
    return {
        "homogeneous": _placed(tables, _homogeneous(tables), "homogeneous baseline"),
        "unaware": _placed(tables, _unaware(tables), "unaware baseline"),
        "per_type": sorted(_per_type(tables, templates), key=lambda c: c.quick_s)[:KEEP],
    }


Identical = tuple[float, PipelineTemplate, int, int]
"""(quick estimate, template, pipelines, micro-batches each)"""


def _placed(tables: ScenarioTables, options: Iterator[Identical], origin: str) -> list[Candidate]:
    """Place the most promising identical-pipeline options, both ways."""
    out: list[Candidate] = []
    for _quick, template, n, m in sorted(options, key=lambda o: o[0]):
        pipelines = [template] * n
        for style in (PlacementStyle(stage_major=False), PlacementStyle(stage_major=True)):
            gpus = place(tables, pipelines, style)
            if gpus is not None:
                sync = estimate_sync_s(tables, pipelines, gpus)
                out.append(Candidate(plan=build_plan(pipelines, [m] * n, gpus,
                                                     tables.scenario.job.schedule),
                                     quick_s=template.time_s(m) + sync, origin=origin))
        if len(out) >= 2 * KEEP:
            break
    return out


def _identical(tables: ScenarioTables, template: PipelineTemplate, most: int) -> Iterator[Identical]:
    """Up to `most` copies of one template, each with the same micro-batch count."""
    batch = tables.scenario.job.global_batch_size
    for n in range(most, 0, -1):
        if batch % (n * template.micro_batch):
            continue
        m = batch // (n * template.micro_batch)
        if template.max_micro_batches is not None and m > template.max_micro_batches:
            continue
        yield template.time_s(m) + template.sync_s(n), template, n, m


def _shapes(tables: ScenarioTables) -> Iterator[tuple[int, int]]:
    """(micro_batch, tp) points profiled for the model's kinds on some type."""
    yield from sorted({(b, tp) for (_, b, tp) in tables.points})


def _homogeneous(tables: ScenarioTables) -> Iterator[Identical]:
    schedule = tables.scenario.job.schedule
    by_type: dict[str, list[ResourceClass]] = {}
    for cls in tables.classes:
        by_type.setdefault(cls.gpu_type, []).append(cls)
    for gpu_type, classes in by_type.items():
        cls = max(classes, key=lambda c: c.num_gpus)  # one zone: rings stay off slow links
        for b, tp in _shapes(tables):
            if (gpu_type, b, tp) not in tables.points or tp > cls.largest_node:
                continue
            for depth in range(1, min(tables.num_layers, cls.slots(tp)) + 1):
                shapes = [StageShape(resource=cls.key, tp=tp)] * depth
                template = fixed_template(tables, schedule, shapes, b,
                                          even_bounds(tables.num_layers, depth))
                if template is None:
                    continue
                yield from _identical(tables, template, cls.slots(tp) // depth)


def _unaware(tables: ScenarioTables) -> Iterator[Identical]:
    """Identical pipelines over every GPU: each takes the same share of every class."""
    schedule: Schedule = tables.scenario.job.schedule
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
            if depth > tables.num_layers:
                continue
            for order in _type_orders(tables, list(per_pipeline)):
                shapes = [StageShape(resource=key, tp=tp)
                          for key in order for _ in range(per_pipeline[key])]
                template = fixed_template(tables, schedule, shapes, b,
                                          even_bounds(tables.num_layers, depth))
                if template is not None:
                    yield from (o for o in _identical(tables, template, n) if o[2] == n)


def _type_orders(
    tables: ScenarioTables, keys: list[tuple[str, str | None]]
) -> list[tuple[tuple[str, str | None], ...]]:
    if len(keys) <= 3:
        return list(itertools.permutations(keys))
    memory = tables.capacity_bytes
    by_memory = sorted(keys, key=lambda k: -memory[k[0]])
    return [tuple(by_memory), tuple(reversed(by_memory))]


def _per_type(tables: ScenarioTables, templates: list[PipelineTemplate]) -> Iterator[Candidate]:
    """Each class filled with copies of one of its best homogeneous templates."""
    options: list[list[tuple[PipelineTemplate, int]]] = []
    for cls in tables.classes:
        own = [t for t in templates if len(t.gpus()) == 1 and cls.key in t.gpus()]
        scored = []
        for t in own:
            copies = cls.slots(t.stages[0].tp) // t.num_stages
            if copies > 0:
                scored.append((copies * t.micro_batch / t.bottleneck_s, t, copies))
        scored.sort(key=lambda x: -x[0])
        options.append([(t, c) for _, t, c in scored[: 2 if len(tables.classes) > 3 else 3]])
    options = [o for o in options if o]
    for combo in itertools.product(*options):
        pipelines = [t for t, copies in combo for _ in range(copies)]
        yield from assemble(tables, pipelines, "per-type baseline")
