"""From chosen templates to a plan document: batch shares, then concrete GPUs.

Batch shares go where they finish soonest (`shares.least_time_shares` over the
linear time model), so fast pipelines take more and a pipeline whose first
micro-batch would finish after everyone else's last gets none (its GPUs stay
idle, and the plan says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.documents import Node, Pipeline, Plan, Schedule, Stage
from planner.search.shares import Timer, least_time_shares
from planner.search.tables import ScenarioTables
from planner.search.templates import PipelineTemplate

__all__ = ["split_batch", "place", "PlacementStyle", "build_plan"]


def split_batch(
    templates: Sequence[PipelineTemplate], global_batch: int
) -> list[int] | None:
    """Micro-batches per pipeline summing exactly to the batch, least finish time first."""
    timers = [_linear_timer(t) for t in templates]
    limits = [t.max_micro_batches or 10**9 for t in templates]
    return least_time_shares(timers, [t.micro_batch for t in templates], limits, global_batch)


def _linear_timer(t: PipelineTemplate) -> Timer:
    return lambda m: 0.0 if m <= 0 else t.time_s(m)


@dataclass(frozen=True, kw_only=True)
class PlacementStyle:
    stage_major: bool = False
    """Stage s of consecutive pipelines share a node (sync rings stay inside nodes);
    otherwise a pipeline's consecutive stages share a node (transfers stay inside)."""


class _FreeGpus:
    def __init__(self, tables: ScenarioTables) -> None:
        self.nodes: dict[tuple[str, str | None], list[Node]] = {
            c.key: list(c.nodes) for c in tables.classes}
        self.next_index = {n.name: 0 for c in tables.classes for n in c.nodes}
        self.by_name = {n.name: n for c in tables.classes for n in c.nodes}

    def free(self, node: Node) -> int:
        return node.gpus - self.next_index[node.name]

    def take(self, node: Node, count: int) -> list[str]:
        start = self.next_index[node.name]
        self.next_index[node.name] = start + count
        return [f"{node.name}:{i}" for i in range(start, start + count)]

    def pick(self, key: tuple[str, str | None], tp: int, prefer: Node | None) -> Node | None:
        if prefer is not None and prefer.gpu_type == key[0] and prefer.zone == key[1] \
                and self.free(prefer) >= tp:
            return prefer
        fitting = [n for n in self.nodes[key] if self.free(n) >= tp]
        if not fitting:
            return None
        # Best fit: partly used nodes first, so whole nodes stay whole for wide stages.
        return min(fitting, key=lambda n: (self.free(n), n.gpus))


def place(
    tables: ScenarioTables,
    templates: Sequence[PipelineTemplate],
    style: PlacementStyle,
) -> list[list[list[str]]] | None:
    """GPU names per pipeline and stage, or None if the stages do not pack onto the nodes."""
    free = _FreeGpus(tables)
    gpus: list[list[list[str]]] = [[[] for _ in t.stages] for t in templates]
    last_node: list[Node | None] = [None] * len(templates)
    order = _placement_order(templates, style)
    for p, s in order:
        shape = templates[p].stages[s]
        prefer = last_node[p]
        if style.stage_major and p > 0 and templates[p - 1] is templates[p]:
            prev = gpus[p - 1][s]
            prefer = free.by_name[prev[0].rpartition(":")[0]] if prev else prefer
        node = free.pick(shape.resource, shape.tp, prefer)
        if node is None:
            return None
        gpus[p][s] = free.take(node, shape.tp)
        last_node[p] = node
    return gpus


def _placement_order(
    templates: Sequence[PipelineTemplate], style: PlacementStyle
) -> list[tuple[int, int]]:
    # Wide stages first, so that narrow ones cannot fragment the nodes they need.
    widest = sorted(range(len(templates)), key=lambda p: -max(s.tp for s in templates[p].stages))
    if not style.stage_major:
        return [(p, s) for p in widest for s in range(templates[p].num_stages)]
    depth = max(t.num_stages for t in templates)
    return [(p, s) for s in range(depth) for p in widest if s < templates[p].num_stages]


def build_plan(
    templates: Sequence[PipelineTemplate],
    micro_batches: Sequence[int],
    gpus: Sequence[Sequence[Sequence[str]]],
    schedule: Schedule,
) -> Plan:
    pipelines = []
    for t, m, stage_gpus in zip(templates, micro_batches, gpus, strict=True):
        if m == 0:
            continue
        bounds = t.partition.bounds
        stages = [
            Stage(gpu_type=shape.gpu_type, tp=shape.tp, gpus=list(stage_gpus[s]),
                  layers=(bounds[s], bounds[s + 1]))
            for s, shape in enumerate(t.stages)
        ]
        pipelines.append(Pipeline(micro_batch_size=t.micro_batch, num_micro_batches=m,
                                  stages=stages))
    return Plan(schedule=schedule, pipelines=pipelines)
