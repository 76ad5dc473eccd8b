"""Per-layer cost arrays of a scenario, compiled once for the search.

The search evaluates thousands of layer ranges; prefix sums over numpy
arrays turn each range's compute, memory and parameter count into O(1).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from planner.costs import GIB, profile_index, state_bytes_per_param
from planner.documents import Node, Scenario

__all__ = ["PointCosts", "ResourceClass", "ScenarioTables", "compile_tables"]


@dataclass(frozen=True, kw_only=True, eq=False)
class PointCosts:
    """Prefix sums over layers at one (gpu_type, micro_batch, tp) point; index i = layers [0, i)."""

    gpu_type: str
    micro_batch: int
    tp: int
    compute_s: np.ndarray
    """forward + backward seconds of one micro-batch."""
    forward_s: np.ndarray
    backward_s: np.ndarray
    activation_bytes: np.ndarray

    # Python lists of the same sums: loops over a few stages read them faster than arrays.
    @functools.cached_property
    def compute_at(self) -> list[float]:
        return cast(list[float], self.compute_s.tolist())

    @functools.cached_property
    def activation_at(self) -> list[float]:
        return cast(list[float], self.activation_bytes.tolist())


@dataclass(frozen=True, kw_only=True)
class ResourceClass:
    """Interchangeable GPUs: one type in one zone. Nodes keep their own sizes."""

    gpu_type: str
    zone: str | None
    nodes: tuple[Node, ...]

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.gpu_type, self.zone)

    # Cached: a class of thousands of nodes is asked these in every inner loop of the search.
    @functools.cached_property
    def num_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @functools.cached_property
    def largest_node(self) -> int:
        return max(n.gpus for n in self.nodes)

    def slots(self, tp: int) -> int:
        """How many tp-GPU stages the class can host (a stage never spans nodes)."""
        if tp not in self._slots:
            self._slots[tp] = sum(n.gpus // tp for n in self.nodes)
        return self._slots[tp]

    @functools.cached_property
    def _slots(self) -> dict[int, int]:
        return {}


@dataclass(frozen=True, kw_only=True, eq=False)
class ScenarioTables:
    scenario: Scenario
    num_layers: int
    params: np.ndarray
    """Prefix sums of parameter counts."""
    output_bytes: np.ndarray
    """Per layer: bytes per sample handed to the next layer."""
    points: dict[tuple[str, int, int], PointCosts]
    classes: tuple[ResourceClass, ...]
    capacity_bytes: dict[str, float]
    """Per GPU type: memory minus the reserved part."""
    max_stages: int
    """The deepest pipeline any part of the search builds: the layer count, or the user's
    cap on a `local` job's blocks where lower."""
    matrices: dict[tuple[object, ...], object] = field(default_factory=dict)
    """Stage cost and fit matrices of the partition DP, shared by every sweep of a search."""

    @functools.cached_property
    def num_gpus(self) -> int:
        return sum(c.num_gpus for c in self.classes)

    @functools.cached_property
    def least_compute_s(self) -> dict[str, float]:
        """Per GPU type: its least GPU-seconds per sample through the whole model over its
        profiled points."""
        least: dict[str, float] = {}
        for (gpu_type, b, tp), point in self.points.items():
            seconds = tp * float(point.compute_s[-1]) / b
            least[gpu_type] = min(seconds, least.get(gpu_type, seconds))
        return least

    @functools.cached_property
    def params_at(self) -> list[float]:
        """`params` as a list (read a few at a time in Python loops)."""
        return cast(list[float], self.params.tolist())

    @functools.cached_property
    def output_at(self) -> list[float]:
        return cast(list[float], self.output_bytes.tolist())

    @functools.cached_property
    def resource_rows(self) -> dict[tuple[tuple[str, str | None], int], int]:
        """Capacity of each (class, tp level): GPUs that stages of at least that tp can use
        (a stage never spans nodes, so wide stages find fewer places than narrow ones)."""
        rows = {}
        for cls in self.classes:
            for level in sorted({1, 2, 4, 8, 16, 32, 64, cls.largest_node}):
                if level <= cls.largest_node:
                    rows[(cls.key, level)] = cls.slots(level) * level
        return rows

    @functools.cached_property
    def resource_levels(self) -> dict[tuple[str, str | None], tuple[int, ...]]:
        """The tp levels of `resource_rows`, per class."""
        levels: dict[tuple[str, str | None], tuple[int, ...]] = {}
        for key, level in self.resource_rows:
            levels[key] = (*levels.get(key, ()), level)
        return levels

    def state_bytes(self, start: int, end: int, tp: int, num_pipelines: int) -> float:
        per_param = state_bytes_per_param(self.scenario, num_pipelines).total
        return float(self.params[end] - self.params[start]) / tp * per_param


def compile_tables(scenario: Scenario, *, max_stages: int | None = None) -> ScenarioTables:
    profiles = profile_index(scenario)
    layers = scenario.model.layers
    kinds = set(layers)
    kind_params = np.array([scenario.model.kinds[k].params for k in layers], dtype=float)
    output_bytes = np.array(
        [scenario.model.kinds[k].output_bytes_per_sample for k in layers], dtype=float)
    points: dict[tuple[str, int, int], PointCosts] = {}
    for gpu_type in sorted({n.gpu_type for n in scenario.cluster.nodes}):
        for b, tp in profiles.complete_points(gpu_type, kinds):
            rows = [profiles.get(gpu_type, k, b, tp) for k in layers]
            forward = np.array([r.forward_ms for r in rows if r], dtype=float) * 1e-3
            backward = np.array([r.backward_ms for r in rows if r], dtype=float) * 1e-3
            acts = np.array([r.activation_bytes for r in rows if r], dtype=float)
            points[(gpu_type, b, tp)] = PointCosts(
                gpu_type=gpu_type, micro_batch=b, tp=tp,
                compute_s=_prefix(forward + backward), forward_s=_prefix(forward),
                backward_s=_prefix(backward), activation_bytes=_prefix(acts))
    return ScenarioTables(
        scenario=scenario, num_layers=len(layers), params=_prefix(kind_params),
        max_stages=len(layers) if max_stages is None else min(max_stages, len(layers)),
        output_bytes=output_bytes, points=points, classes=_resource_classes(scenario),
        capacity_bytes={
            t: g.memory_gib * GIB - scenario.reserved_gib(t) * GIB
            for t, g in scenario.gpu_types.items()
        },
    )


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(values)))


def _resource_classes(scenario: Scenario) -> tuple[ResourceClass, ...]:
    groups: dict[tuple[str, str | None], list[Node]] = {}
    for node in scenario.cluster.nodes:
        groups.setdefault((node.gpu_type, node.zone), []).append(node)
    order = Counter({key: -sum(n.gpus for n in nodes) for key, nodes in groups.items()})
    return tuple(
        ResourceClass(gpu_type=t, zone=z, nodes=tuple(groups[(t, z)]))
        for (t, z) in sorted(groups, key=lambda k: (order[k], k[0], k[1] or ""))
    )
