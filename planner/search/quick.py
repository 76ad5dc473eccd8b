"""A fast estimate of a placed candidate's gradient-sync time.

The reference sync ring of a layer spans the holders of that layer in every
pipeline: one slow or shared-interface node among them slows every holder.
Grouping the pipelines by template makes this O(layers x templates) instead of
O(layers x pipelines), which the search needs at thousands of GPUs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from planner.costs import zone_link
from planner.documents import Node, Scenario
from planner.search.tables import ScenarioTables
from planner.search.templates import PipelineTemplate, rings_s

__all__ = ["estimate_sync_s", "inside_sync_s", "replicas_sync_s", "rough_sync_s"]


def estimate_sync_s(
    tables: ScenarioTables,
    templates: Sequence[PipelineTemplate],
    gpus: Sequence[Sequence[Sequence[str]]],
) -> float:
    """Largest per-stage sync time, with each layer's ring at its slowest holder's link."""
    n = len(templates)
    if n <= 1:
        return 0.0
    scenario = tables.scenario
    by_name = {node.name: node for c in tables.classes for node in c.nodes}
    used: dict[str, int] = {}
    for pipeline in gpus:
        for stage in pipeline:  # a stage's GPUs share one node
            name = stage[0].rpartition(":")[0]
            used[name] = used.get(name, 0) + len(stage)
    share = {name: min(1.0, by_name[name].num_nics / count) for name, count in used.items()}
    num_layers = tables.num_layers
    holder_nodes: list[set[str]] = [set() for _ in range(num_layers)]
    seen: set[tuple[int, int, str]] = set()
    for template, pipeline in zip(templates, gpus, strict=True):
        bounds = template.partition.bounds
        for s, stage in enumerate(pipeline):
            node = stage[0].rpartition(":")[0]
            key = (id(template), s, node)
            if key in seen:
                continue
            seen.add(key)
            for layer in range(bounds[s], bounds[s + 1]):
                holder_nodes[layer].add(node)
    bandwidth = np.empty(num_layers)
    latency = np.empty(num_layers)
    previous: set[str] | None = None
    for layer, names in enumerate(holder_nodes):
        if names != previous:  # consecutive layers mostly share their holders
            ring = _ring(scenario, [by_name[x] for x in names], share)
            previous = names
        bandwidth[layer], latency[layer] = ring
    return _worst_stage(tables, templates, n, bandwidth, latency)


def rough_sync_s(tables: ScenarioTables, templates: Sequence[PipelineTemplate]) -> float:
    """Sync before placement: every class's nodes fully used, rings between nodes unless
    the replicas of one class fit in one of its nodes."""
    n = len(templates)
    if n <= 1:
        return 0.0
    distinct = list({id(t): t for t in templates}.values())
    holders: list[set[tuple[str, str | None]]] = [set() for _ in range(tables.num_layers)]
    for t in distinct:
        bounds = t.partition.bounds
        for s, shape in enumerate(t.stages):
            for layer in range(bounds[s], bounds[s + 1]):
                holders[layer].add(shape.resource)
    first = {c.key: c.nodes[0] for c in tables.classes}
    by_key = {c.key: c for c in tables.classes}
    # Replicas of one class that fit in one node keep every ring inside it (stage-major).
    inside = (len({key for keys in holders for key in keys}) == 1
              and n * max(s.tp for t in distinct for s in t.stages)
              <= by_key[next(iter(holders[0]))].largest_node)
    share = {c.nodes[0].name: min(min(1.0, x.num_nics / x.gpus) for x in c.nodes)
             for c in tables.classes}
    bandwidth = np.empty(tables.num_layers)
    latency = np.empty(tables.num_layers)
    rings: dict[frozenset[tuple[str, str | None]], tuple[float, float]] = {}
    for layer, keys in enumerate(holders):
        held_by = frozenset(keys)  # a few distinct sets over all layers
        if held_by not in rings:
            nodes = [first[k] for k in keys]
            if len(nodes) == 1 and not inside:  # n holders of one class across its nodes
                nodes = nodes * 2
            rings[held_by] = _ring(tables.scenario, nodes, share)
        bandwidth[layer], latency[layer] = rings[held_by]
    return _worst_stage(tables, distinct, n, bandwidth, latency)


def inside_sync_s(tables: ScenarioTables, template: PipelineTemplate, n: int) -> float:
    """Sync of `n` replicas of a one-type template whose rings all stay inside one node."""
    if n <= 1:
        return 0.0
    link = tables.scenario.cluster.intra_node[template.stages[0].gpu_type]
    bandwidth = np.full(tables.num_layers, link.bandwidth_gb_per_s * 1e9)
    latency = np.full(tables.num_layers, link.latency_us * 1e-6)
    return _worst_stage(tables, [template], n, bandwidth, latency)


def replicas_sync_s(tables: ScenarioTables, template: PipelineTemplate, n: int) -> float:
    """Sync of `n` identical replicas of a template through several classes, placed
    stage-major: a stage's ring stays inside a node where its n copies fit in one of its
    class's nodes, and runs between nodes at the class's links otherwise (what the
    placement gives at best: the placed candidate's sync is estimated again)."""
    if n <= 1:
        return 0.0
    largest = {c.key: c.largest_node for c in tables.classes}
    grad_bytes = tables.scenario.job.grad_bytes
    bounds = template.partition.bounds
    parts = list(template.sync_parts)
    for s, shape in enumerate(template.stages):
        if n * shape.tp <= largest[shape.resource]:
            link = tables.scenario.cluster.intra_node[shape.gpu_type]
            params = float(tables.params[bounds[s + 1]] - tables.params[bounds[s]])
            parts[s] = (params * grad_bytes / shape.tp / (link.bandwidth_gb_per_s * 1e9),
                        link.latency_us * 1e-6 * (bounds[s + 1] - bounds[s]))
    return rings_s(parts, n)


def _worst_stage(
    tables: ScenarioTables,
    templates: Sequence[PipelineTemplate],
    n: int,
    bandwidth: np.ndarray,
    latency: np.ndarray,
) -> float:
    scenario = tables.scenario
    params = np.diff(tables.params)
    grad_bytes = scenario.job.grad_bytes
    data = np.concatenate(([0.0], np.cumsum(params * grad_bytes / bandwidth)))
    lat = np.concatenate(([0.0], np.cumsum(latency)))
    worst = 0.0
    for template in {id(t): t for t in templates}.values():
        bounds = template.partition.bounds
        for s, shape in enumerate(template.stages):
            start, end = bounds[s], bounds[s + 1]
            seconds = (2 * (n - 1) / n * (data[end] - data[start]) / shape.tp
                       + 2 * (n - 1) * (lat[end] - lat[start]))
            worst = max(worst, seconds)
    return worst


def _ring(scenario: Scenario, nodes: list[Node], share: dict[str, float]) -> tuple[float, float]:
    if len(nodes) == 1:
        link = scenario.cluster.intra_node[nodes[0].gpu_type]
        return link.bandwidth_gb_per_s * 1e9, link.latency_us * 1e-6
    zones = sorted({n.zone for n in nodes if n.zone is not None})
    links = [zone_link(scenario, a, b) for a, b in itertools.combinations(zones, 2)]
    link = min(links, key=lambda x: x.bandwidth_gb_per_s, default=scenario.cluster.inter_node)
    intra = min(scenario.cluster.intra_node[n.gpu_type].bandwidth_gb_per_s for n in nodes)
    bandwidth = min(link.bandwidth_gb_per_s * min(share[n.name] for n in nodes), intra)
    return bandwidth * 1e9, link.latency_us * 1e-6
