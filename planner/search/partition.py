"""Exact contiguous layer partition: the least bottleneck stage time under memory limits.

A dynamic program over stages counted from the pipeline's end: the k-th stage
from the end keeps k micro-batches in flight under 1F1B, so one sweep answers
every pipeline depth at once. Stage time per micro-batch is forward plus
backward, plus (with blocking transfers) both neighbour transfers twice, as in
COST_MODEL.md section 3; a stage fits when its state and in-flight activations
fit beside the reserved memory (section 4).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from planner.costs import state_bytes_per_param
from planner.search.tables import PointCosts, ScenarioTables

__all__ = ["StageSpec", "LinkCost", "Partition", "SuffixSweep", "fixed_partition"]

INF = float("inf")


@dataclass(frozen=True, kw_only=True)
class LinkCost:
    latency_s: float
    bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    """The k-th stage from the pipeline's end: where it runs and what it keeps."""

    point: PointCosts
    in_flight: int
    link_in: LinkCost | None
    """Link from the previous stage (None for a stage that can only be first)."""


@dataclass(frozen=True, kw_only=True)
class Partition:
    bounds: tuple[int, ...]
    """Stage s holds layers [bounds[s], bounds[s+1])."""
    stage_s: tuple[float, ...]
    """Per micro-batch time of each stage, blocking transfers included."""

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)


class SuffixSweep:
    """g[k][j]: least bottleneck covering layers [j, L) with the last k stages."""

    def __init__(self, tables: ScenarioTables, *, blocking: bool, num_pipelines: int) -> None:
        self.tables = tables
        self.blocking = blocking
        self.num_pipelines = num_pipelines
        self.best: list[np.ndarray] = []
        self.choice: list[np.ndarray] = []
        self.specs: list[StageSpec] = []

    def push(self, spec: StageSpec) -> None:
        """Add one more stage in front of those already swept."""
        link_out = self.specs[-1].link_in if self.specs else None
        cost, fits = self._stage_matrix(spec, link_out)
        if self.specs:
            total = np.maximum(cost, self.best[-1][None, :])
        else:
            total = np.full_like(cost, INF)
            total[:, -1] = cost[:, -1]
        total[~fits] = INF
        choice = np.argmin(total, axis=1)
        self.best.append(total[np.arange(total.shape[0]), choice])
        self.choice.append(choice)
        self.specs.append(spec)

    def depth_bottleneck(self, num_stages: int) -> float:
        return float(self.best[num_stages - 1][0])

    def extract(self, num_stages: int) -> Partition | None:
        if num_stages > len(self.best) or not np.isfinite(self.best[num_stages - 1][0]):
            return None
        bounds = [0]
        for k in range(num_stages, 0, -1):
            bounds.append(int(self.choice[k - 1][bounds[-1]]))
        return fixed_partition(self.tables, self.specs[:num_stages], bounds,
                               blocking=self.blocking, num_pipelines=self.num_pipelines)

    def _stage_matrix(
        self, spec: StageSpec, link_out: LinkCost | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Time and fit of this stage over every layer range [j, e) (upper triangle).

        Cached per search: thousands of sweeps push the same few stage shapes."""
        cache = self.tables.matrices
        cost_key = ("cost", id(spec.point), spec.link_in, link_out, self.blocking)
        fits_key = ("fits", id(spec.point), spec.in_flight, spec.link_in is None,
                    self.num_pipelines)
        if cost_key not in cache or fits_key not in cache:
            cost, fits = self._compute_matrix(spec, link_out)
            cost.flags.writeable = fits.flags.writeable = False
            cache.setdefault(cost_key, cost)
            cache.setdefault(fits_key, fits)
        return cache[cost_key], cache[fits_key]

    def _compute_matrix(
        self, spec: StageSpec, link_out: LinkCost | None
    ) -> tuple[np.ndarray, np.ndarray]:
        tables = self.tables
        point = spec.point
        size = tables.num_layers + 1
        compute = point.compute_s[None, :] - point.compute_s[:, None]
        if self.blocking:
            x_in = _transfer_row(tables, point.micro_batch, spec.link_in, first_index_free=True)
            x_out = _transfer_row(tables, point.micro_batch, link_out, first_index_free=False)
            compute = compute + 2.0 * (x_in[:, None] + x_out[None, :])
        state = (tables.params[None, :] - tables.params[:, None]) / point.tp * self._state_per_param
        acts = (point.activation_bytes[None, :] - point.activation_bytes[:, None]) * spec.in_flight
        fits = (state + acts <= tables.capacity_bytes[point.gpu_type]) & _upper(size)
        if spec.link_in is None:
            fits[1:, :] = False
        return compute, fits

    @property
    def _state_per_param(self) -> float:
        return state_bytes_per_param(self.tables.scenario, self.num_pipelines).total


def fixed_partition(
    tables: ScenarioTables,
    specs_from_end: list[StageSpec],
    bounds: list[int],
    *,
    blocking: bool,
    num_pipelines: int,
) -> Partition | None:
    """Stage times of a given split, or None if a stage does not fit in memory."""
    depth = len(specs_from_end)
    per_param = state_bytes_per_param(tables.scenario, num_pipelines).total
    stage_s = []
    for s in range(depth):
        spec = specs_from_end[depth - s - 1]
        point = spec.point
        start, end = bounds[s], bounds[s + 1]
        state = float(tables.params[end] - tables.params[start]) / point.tp * per_param
        acts = float(point.activation_bytes[end] - point.activation_bytes[start]) * spec.in_flight
        if end <= start or state + acts > tables.capacity_bytes[point.gpu_type]:
            return None
        seconds = float(point.compute_s[end] - point.compute_s[start])
        if blocking:
            link_out = specs_from_end[depth - s - 2].link_in if s < depth - 1 else None
            for link, layer in ((spec.link_in if s > 0 else None, start - 1),
                                (link_out, end - 1)):
                if link is not None:
                    seconds += 2 * (link.latency_s + tables.output_bytes[layer]
                                    * point.micro_batch / link.bytes_per_s)
        stage_s.append(seconds)
    return Partition(bounds=tuple(bounds), stage_s=tuple(stage_s))


@functools.cache
def _upper(size: int) -> np.ndarray:
    """Ranges [j, e) with j < e."""
    mask = np.triu(np.ones((size, size), dtype=bool), k=1)
    mask.flags.writeable = False
    return mask


def _transfer_row(
    tables: ScenarioTables, micro_batch: int, link: LinkCost | None, *, first_index_free: bool
) -> np.ndarray:
    """Seconds to send the output of layer i-1 across `link`, for every boundary i."""
    size = tables.num_layers + 1
    row = np.zeros(size)
    if link is None:
        return row
    row[1:] = link.latency_s + tables.output_bytes * micro_batch / link.bytes_per_s
    if first_index_free:
        row[0] = 0.0
    else:
        row[-1] = 0.0
    return row
