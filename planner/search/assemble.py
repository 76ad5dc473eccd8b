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
from planner.search.shares import least_time_shares
from planner.search.tables import ScenarioTables
from planner.search.templates import PipelineTemplate

__all__ = ["split_batch", "place", "PlacementStyle", "build_plan"]


def split_batch(
    templates: Sequence[PipelineTemplate], global_batch: int
) -> list[int] | None:
    """Micro-batches per pipeline summing exactly to the batch, least finish time first."""
    clocks = {id(t): _LinearClock(t) for t in templates}
    return least_time_shares([clocks[id(t)] for t in templates], global_batch)


class _LinearClock:
    """fill + (m - 1) * bottleneck, and its inverse."""

    def __init__(self, template: PipelineTemplate) -> None:
        self.micro_batch = template.micro_batch
        self.limit = template.max_micro_batches or 10**9
        self.fill_s = template.fill_s
        self.bottleneck_s = template.bottleneck_s

    def time_of(self, num_micro_batches: int) -> float:
        if num_micro_batches <= 0:
            return 0.0
        return self.fill_s + (num_micro_batches - 1) * self.bottleneck_s

    def most_by(self, target_s: float, cap: int) -> int:
        if target_s < self.fill_s:
            return 0
        most = min(cap, int((target_s - self.fill_s) / self.bottleneck_s) + 1)
        # Float rounding at the boundary: step to the exact answer.
        while most > 0 and self.time_of(most) > target_s:
            most -= 1
        while most < cap and self.time_of(most + 1) <= target_s:
            most += 1
        return most


@dataclass(frozen=True, kw_only=True)
class PlacementStyle:
    stage_major: bool = False
    """Stage s of consecutive pipelines share a node (sync rings stay inside nodes);
    otherwise a pipeline's consecutive stages share a node (transfers stay inside)."""
    aligned: bool = False
    """(Pipeline-major) A run of a pipeline's stages on one class starts on a node that holds
    all of it where one does: no pipeline straddles two nodes for want of packing, and the
    GPUs left idle spread over the nodes, whose shared interfaces then serve fewer rings."""


class _FreeGpus:
    """Free GPUs per node, with nodes of each class bucketed by how many are free."""

    def __init__(self, tables: ScenarioTables) -> None:
        self.next_index = {n.name: 0 for c in tables.classes for n in c.nodes}
        self.by_name = {n.name: n for c in tables.classes for n in c.nodes}
        # buckets[class][free] = nodes with exactly that many free GPUs, in cluster order
        self.buckets: dict[tuple[str, str | None], dict[int, dict[str, Node]]] = {}
        for c in tables.classes:
            bucket = self.buckets.setdefault(c.key, {})
            for n in c.nodes:
                bucket.setdefault(n.gpus, {})[n.name] = n

    def free(self, node: Node) -> int:
        return node.gpus - self.next_index[node.name]

    def take(self, node: Node, count: int) -> list[str]:
        start = self.next_index[node.name]
        bucket = self.buckets[(node.gpu_type, node.zone)]
        del bucket[node.gpus - start][node.name]
        self.next_index[node.name] = start + count
        bucket.setdefault(node.gpus - start - count, {})[node.name] = node
        return [f"{node.name}:{i}" for i in range(start, start + count)]

    def pick(self, key: tuple[str, str | None], tp: int, prefer: Node | None,
             run: int = 0) -> Node | None:
        """A node for a stage of `tp` GPUs: `prefer` where it has room, else one with room
        for the `run` GPUs of the stages that follow on this class where one has, else any.
        Best fit: partly used nodes first, so whole nodes stay whole for wide stages."""
        if prefer is not None and prefer.gpu_type == key[0] and prefer.zone == key[1] \
                and self.free(prefer) >= tp:
            return prefer
        bucket = self.buckets[key]
        for need in (run, tp) if run > tp else (tp,):
            for free in sorted(f for f, nodes in bucket.items() if f >= need and nodes):
                return next(iter(bucket[free].values()))
        return None


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
        run = _run_gpus(templates[p], s) if style.aligned and not style.stage_major else 0
        node = free.pick(shape.resource, shape.tp, prefer, run)
        if node is None:
            return None
        gpus[p][s] = free.take(node, shape.tp)
        last_node[p] = node
    return gpus


def _run_gpus(template: PipelineTemplate, first: int) -> int:
    """GPUs of stage `first` and of the stages after it on the same class: what a node must
    hold for them to share it."""
    resource = template.stages[first].resource
    total = 0
    for shape in template.stages[first:]:
        if shape.resource != resource:
            break
        total += shape.tp
    return total


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
        # Built from validated parts: construct without re-validating thousands of stages.
        stages = [
            Stage.model_construct(gpu_type=shape.gpu_type, tp=shape.tp, gpus=list(stage_gpus[s]),
                                  layers=(bounds[s], bounds[s + 1]))
            for s, shape in enumerate(t.stages)
        ]
        pipelines.append(Pipeline.model_construct(micro_batch_size=t.micro_batch, num_micro_batches=m,
                                  stages=stages))
    return Plan(schedule=schedule, pipelines=pipelines)
