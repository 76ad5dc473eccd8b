"""Exact contiguous layer partition: the least bottleneck stage time under memory limits.

A dynamic program over stages counted from the pipeline's end: the k-th stage
from the end keeps k micro-batches in flight under 1F1B, so one sweep answers
every pipeline depth at once. Stage time per micro-batch is forward plus
backward, plus (with blocking transfers) both neighbour transfers twice, as in
docs/formats.md (time); a stage fits when its state and in-flight activations
fit beside the reserved memory (section 4).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Optional, cast

import numpy as np

from planner.costs import state_bytes_per_param
from planner.search.tables import PointCosts, ScenarioTables

__all__ = [
    "StageSpec", "LinkCost", "Partition", "SuffixSweep", "extract_light_together", "fixed_partition",
    "sweep_together",
]

INF = float("inf")


class LinkCost(NamedTuple):
    # A tuple: hashed in C where it keys the stage matrices and spec runs.
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
        self.costs: list[np.ndarray] = []
        self.cost_matrices: list[_Matrices] = []
        """Per pushed stage: its time over every layer range, as the DP saw it."""
        self._front_fits: _Matrices | None = None

    def push(self, spec: StageSpec) -> None:
        """Add one more stage in front of those already swept."""
        link_out = self.specs[-1].link_in if self.specs else None
        costs = self._costs(spec, link_out)
        fits = self._fits(spec)
        # The k-th stage from the end starts at some j <= L - k and ends at e <= L - k + 1:
        # each stage behind it needs a layer. Only that corner of the matrices is swept.
        starts = self.tables.num_layers - len(self.specs)
        if starts <= 0:  # more stages than layers: no split
            best, choice = np.full(1, INF), np.zeros(1, dtype=np.intp)
        elif not self.specs:  # the last stage ends with the model
            best = np.where(fits.by_end[:starts, -1] >= spec.in_flight,
                            costs.by_end[:starts, -1], INF)
            choice = np.full(starts, self.tables.num_layers)
        else:
            best, choice = self._sweep_band(spec, costs, fits, starts)
        self._record(spec, costs, fits, best, choice)

    def _record(self, spec: StageSpec, costs: _Matrices, fits: _Matrices, best: np.ndarray,
                choice: np.ndarray) -> None:
        self._front_fits = fits
        self.best.append(best)
        self.choice.append(choice)
        self.specs.append(spec)
        self.costs.append(costs.by_end)
        self.cost_matrices.append(costs)

    def _goes_on(self, more_stages: int) -> bool:
        return more_stages > 0 and self.extendable() and self.can_reach_first_layer(more_stages)

    def _sweep_band(
        self, spec: StageSpec, costs: _Matrices, fits: _Matrices, starts: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Least max(this stage's time over [j, e), the rest's best from e) for each start j.

        Memory bounds how many layers a stage holds, more tightly the more micro-batches it
        keeps in flight: only ranges up to the longest that fits are swept, through
        matrices indexed by (start, length) instead of (start, end)."""
        width = min(fits.longest(spec.in_flight), starts)
        if width == 0:
            return np.full(starts, INF), np.arange(1, starts + 1)
        num_layers = self.tables.num_layers
        window = (slice(0, starts), slice(0, width))
        ends = _ends(num_layers)[window]
        rest = np.concatenate((self.best[-1], _infinities(num_layers + 1)))[ends]
        total = np.where(fits.by_length[window] >= spec.in_flight,
                         np.maximum(costs.by_length[window], rest), INF)
        pick = total.argmin(axis=1)
        return total[_rows(starts), pick], ends[_rows(starts), pick]

    def branch(self, front_link_in: LinkCost, *, keep: int) -> SuffixSweep:
        """A copy of the last `keep` stages swept whose front-most one receives over
        `front_link_in` instead (where another segment will join the pipeline), ready for
        more stages in front."""
        copy = SuffixSweep(self.tables, blocking=self.blocking, num_pipelines=self.num_pipelines)
        copy.best, copy.choice, copy.specs, copy.costs, copy.cost_matrices = (
            self.best[:keep - 1], self.choice[:keep - 1], self.specs[:keep - 1],
            self.costs[:keep - 1], self.cost_matrices[:keep - 1])
        front = self.specs[keep - 1]
        copy.push(StageSpec(point=front.point, in_flight=front.in_flight, link_in=front_link_in))
        return copy

    def extendable(self) -> bool:
        """Whether a stage pushed in front could still give a pipeline that fits: the
        stages swept so far must cover some suffix [j, L) with j >= 1 (the new stage needs a
        layer). Once they cannot, no deeper pipeline of these stages fits either."""
        return bool(np.isfinite(self.best[-1][1:]).any())

    def can_reach_first_layer(self, more_stages: int) -> bool:
        """Whether `more_stages` more stages, none holding more layers than the front-most
        one can (same shape, as many micro-batches in flight or more), could extend the
        stages swept so far back to layer 0: what any pipeline needs."""
        best = self.best[-1]
        if best[0] < INF:
            return True
        finite = np.flatnonzero(best < INF)
        front, fits = self.specs[-1], self._front_fits
        assert fits is not None
        # The first stage holds at least layer 0; a range fits only if its shorter ones do.
        if finite.size == 0 or fits.by_end[0, 1] < front.in_flight:
            return False
        return int(finite[0]) <= more_stages * fits.longest(front.in_flight)

    def depth_bottleneck(self, num_stages: int) -> float:
        return float(self.best[num_stages - 1][0])

    def extract(self, num_stages: int) -> Partition | None:
        if num_stages > len(self.best) or not np.isfinite(self.best[num_stages - 1][0]):
            return None
        return self._walk(num_stages, self.choice)

    def extract_light(self, num_stages: int) -> Partition | None:
        """Of the splits with the least bottleneck, one whose heaviest stage holds the fewest
        parameters per GPU. Many splits tie on the bottleneck (set by one slow stage, often
        one behind a slow link), and the heaviest stage sets the gradient sync: a second DP
        over the same stage matrices, each stage held to the bottleneck."""
        return extract_light_together([self], [[num_stages]])[0][num_stages]

    def extract_least_time(self, num_stages: int, num_micro_batches: int) -> Partition | None:
        """The split of least fill + (m - 1) * bottleneck for m micro-batches, where that is
        less than the least-bottleneck split's; else None. With few micro-batches the fill
        weighs as much as the bottleneck: a fast GPU may best take nearly every layer and a
        slow one the rest, however unbalanced (a 7 + 1 split of 8 layers over an H100 and
        an A100, 2 micro-batches, is 23% faster than the balanced one)."""
        least = self.extract(num_stages)
        if least is None:
            return None
        splits = _LeastTime(self, num_stages)
        weight = max(num_micro_batches - 1, 0)
        best_s, best_cap = splits.fill_of(least) + weight * least.bottleneck_s, None
        # A cap B pays (m - 1) B: above the least bottleneck B* it can only win while the
        # fill it saves, at most this split's fill less the least fill at any cap, exceeds
        # (m - 1)(B - B*).
        saving = best_s - weight * least.bottleneck_s - splits.least_sum(math.inf)[0]
        if saving < LEAST_TIME_GAIN * best_s:
            return None  # many micro-batches: the fill cannot weigh enough
        reach = math.inf if weight == 0 else saving / weight
        caps = splits.caps(least.bottleneck_s, least.bottleneck_s + reach)
        for cap, fill in zip(caps, splits.least_sums(caps), strict=True):
            if fill + weight * cap < best_s * (1 - 1e-9):
                best_s, best_cap = fill + weight * cap, cap
        return None if best_cap is None else splits.walk(best_cap)

    def _walk(self, num_stages: int, choices: Sequence[np.ndarray]) -> Partition:
        """The split that `choices` (per stage from the end, each start's end) give from 0."""
        bounds = [0]
        stage_s = []
        start = 0
        for k in range(num_stages, 0, -1):
            # item(): plain Python numbers, without a numpy scalar per lookup (templates of
            # deep pipelines walk tens of thousands of stages per search).
            end = choices[k - 1].item(start)
            stage_s.append(self.costs[k - 1].item(start, end))
            bounds.append(end)
            start = end
        return Partition(bounds=tuple(bounds), stage_s=tuple(stage_s))

    def lightest_possible(self, split: Partition, num_stages: int) -> bool:
        """Whether no split over `num_stages` stages of this sweep's tp has a heaviest stage
        lighter than `split`'s, whatever its times or memory (the light DP's bound)."""
        tp = self.specs[0].point.tp
        if any(spec.point.tp != tp for spec in self.specs[:num_stages]):
            return False
        params = self.tables.params
        bounds = split.bounds
        heaviest = max(float(params[bounds[s + 1]] - params[bounds[s]])
                       for s in range(num_stages))
        return heaviest <= float(_least_heaviest(self.tables)[num_stages]) * (1 + 1e-12)

    def _band(self, spec: StageSpec, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For the light split: per start below `top` and length up to the longest range that
        fits (and `top`), the range's end, its parameters per GPU, and whether it fits."""
        fits = self._fits(spec)
        width = max(1, min(fits.longest(spec.in_flight), top))
        ends = _ends(self.tables.num_layers)[:top, :width]
        ok = fits.by_length[:top, :width] >= spec.in_flight  # past the model: -1, never fits
        return ends, self._params_per_gpu(spec.point.tp)[:top, :width], ok

    def _params_per_gpu(self, tp: int) -> np.ndarray:
        """Parameters per GPU of every range, by [start, length - 1] (cached per search)."""
        key = ("params per gpu", tp)
        cache = self.tables.matrices
        found = cache.get(key)
        if found is None:
            size = self.tables.num_layers + 1
            params = np.concatenate((self.tables.params, np.full(size, np.inf)))
            found = cache[key] = (params[_ends(size - 1)] - params[:size, None]) / tp
        return cast(np.ndarray, found)

    def _costs(self, spec: StageSpec, link_out: LinkCost | None) -> _Matrices:
        """Time of this stage over every layer range [j, e): compute plus, with blocking
        transfers, both neighbour transfers twice. Cached per search: thousands of sweeps
        push the same few stage shapes."""
        key = ("cost", id(spec.point), spec.link_in, link_out, self.blocking)
        cache = self.tables.matrices
        found = cast(_MaybeMatrices, cache.get(key))
        if found is None:
            tables, point = self.tables, spec.point
            cost = point.compute_s[None, :] - point.compute_s[:, None]
            if self.blocking:
                x_in = _transfer_row(tables, point.micro_batch, spec.link_in, first_index_free=True)
                x_out = _transfer_row(tables, point.micro_batch, link_out, first_index_free=False)
                cost = cost + 2.0 * (x_in[:, None] + x_out[None, :])
            found = cache[key] = _Matrices(cost, INF)
        return found

    def _fits(self, spec: StageSpec) -> _Matrices:
        """The most micro-batches in flight with which this stage fits over each layer range
        [j, e): the largest k with state + k * activations <= capacity; -1 where nothing fits
        or the range is empty (a stage that can only be first fits only from layer 0)."""
        first_only = spec.link_in is None
        key = ("most", id(spec.point), first_only, self.num_pipelines)
        cache = self.tables.matrices
        found = cast(_MaybeMatrices, cache.get(key))
        if found is None:
            tables, point = self.tables, spec.point
            size = tables.num_layers + 1
            state = ((tables.params[None, :] - tables.params[:, None]) / point.tp
                     * self._state_per_param)
            acts = point.activation_bytes[None, :] - point.activation_bytes[:, None]
            capacity = tables.capacity_bytes[point.gpu_type]
            with np.errstate(divide="ignore", invalid="ignore"):
                guess = np.floor((capacity - state) / np.where(acts > 0, acts, 1.0))
            most = np.where(acts > 0, np.clip(guess, -1, MOST), MOST)
            # The division rounds; settle the boundary with the very test the estimate uses.
            most = np.where(state + acts * (most + 1) <= capacity, most + 1, most)
            most = np.where(state + acts * np.maximum(most, 0) > capacity, most - 1, most)
            most = np.where((state <= capacity) & _upper(size), np.clip(most, -1, MOST), -1)
            # Compared at every push: 32-bit integers halve the bytes each comparison reads.
            most = most.astype(np.int32)
            if first_only:
                most[1:, :] = -1
            found = cache[key] = _Matrices(most, -1)
        return found

    @property
    def _state_per_param(self) -> float:
        return state_bytes_per_param(self.tables.scenario, self.num_pipelines).total


LEAST_TIME_CAPS = 24
"""Bottleneck caps tried by `extract_least_time` at most (evenly spaced by rank beyond)."""
LEAST_TIME_GAIN = 0.01
"""`extract_least_time` looks no further where the least fill under any cap saves less than
this share of the least-bottleneck split's time."""


class _LeastTime:
    """Splits of least fill under a cap on every stage's time, over a sweep's own stage
    matrices: the fill is the sum of the stages' times (plus, without blocking transfers,
    each boundary's transfer, as the template counts it). Ranges are read by (start,
    length) up to the longest any stage fits, as the sweep reads them."""

    def __init__(self, sweep: SuffixSweep, num_stages: int) -> None:
        tables = sweep.tables
        self.num_layers = size = tables.num_layers
        specs = sweep.specs[:num_stages]
        width = max(1, max(sweep._fits(spec).longest(spec.in_flight) for spec in specs))
        self.ends = _ends(size)[:, :width]
        self.costs: list[np.ndarray] = []
        self.extra: list[np.ndarray] = []
        for k, spec in enumerate(specs, start=1):
            fits = sweep._fits(spec).by_length[:, :width] >= spec.in_flight
            self.costs.append(np.where(fits, sweep.cost_matrices[k - 1].by_length[:, :width], INF))
            extra = np.zeros(size + 1)
            if not sweep.blocking and k < num_stages and spec.link_in is not None:
                link = spec.link_in
                extra[1:] = 2 * (link.latency_s + tables.output_bytes * spec.point.micro_batch
                                 / link.bytes_per_s)
            self.extra.append(extra)
        # The last stage ends with the model: its time from each start j (length size - j).
        self.last_s = np.full(size + 1, INF)
        starts = _rows(size + 1)[:-1]
        length = size - starts
        inside = length <= width
        self.last_s[:-1][inside] = self.costs[0][starts[inside], length[inside] - 1]
        self._found: dict[float, tuple[float, list[np.ndarray]]] = {}

    def least_sum(self, cap: float) -> tuple[float, list[np.ndarray]]:
        """The least fill of a split whose every stage takes at most `cap`, and each stage's
        best end by start (from the second stage from the end on)."""
        if cap not in self._found:
            size = self.num_layers
            rows = _rows(size + 1)
            last = self.last_s
            best = np.where(last <= cap, last, INF) + self.extra[0]
            choices = []
            for cost, extra in zip(self.costs[1:], self.extra[1:], strict=True):
                behind = np.concatenate((best, _infinities(size + 1)))[self.ends]
                total = np.where(cost <= cap, cost, INF) + behind
                pick = total.argmin(axis=1)
                best = total[rows, pick] + extra
                choices.append(self.ends[rows, pick])
            self._found[cap] = (float(best[0]), choices)
        return self._found[cap]

    def least_sums(self, caps: list[float]) -> list[float]:
        """`least_sum(cap)[0]` for every cap at once: one numpy pass per stage over all of
        them (deep pipelines try up to LEAST_TIME_CAPS caps, each a pass per stage)."""
        last = self.last_s
        bound = np.array(caps)[:, None]
        best = np.where(last[None, :] <= bound, last[None, :], INF) + self.extra[0][None, :]
        padding = np.full(best.shape, INF)
        for cost, extra in zip(self.costs[1:], self.extra[1:], strict=True):
            # Only ranges within the largest cap count: the columns up to the longest.
            under = np.flatnonzero((cost <= bound.max()).any(axis=0))
            width = int(under[-1]) + 1 if under.size else 1
            behind = np.concatenate((best, padding), axis=1)[:, self.ends[:, :width]]
            total = np.where(cost[None, :, :width] <= bound[:, :, None], cost[None, :, :width],
                             INF) + behind
            best = total.min(axis=2) + extra[None, :]
        return [float(x) for x in best[:, 0]]

    def fill_of(self, part: Partition) -> float:
        """The fill of a split of these stages, as `least_sum` counts it."""
        depth = len(self.costs)
        return sum(part.stage_s) + sum(float(self.extra[depth - s - 1][start])
                                       for s, start in enumerate(part.bounds[:-1]))

    def caps(self, low: float, high: float) -> list[float]:
        """The stage times in [low, high] (`low` itself among them): where the least fill
        under a cap can change."""
        values = np.unique(np.concatenate([[low]] + [
            c[(c >= low) & (c <= high)] for c in self.costs]))
        if values.size > LEAST_TIME_CAPS:
            values = values[np.linspace(0, values.size - 1, LEAST_TIME_CAPS).round().astype(int)]
        return [float(v) for v in values]

    def walk(self, cap: float) -> Partition:
        _, choices = self.least_sum(cap)
        bounds, stage_s, start = [0], [], 0
        for k in range(len(self.costs), 0, -1):
            end = self.num_layers if k == 1 else int(choices[k - 2][start])
            stage_s.append(float(self.costs[k - 1][start, end - start - 1]))
            bounds.append(end)
            start = end
        return Partition(bounds=tuple(bounds), stage_s=tuple(stage_s))


_MaybeMatrices = Optional["_Matrices"]  # built once: `cast` runs on every push
MOST = 1 << 30  # in flight: more than any schedule keeps


class _Matrices:
    """One per-range matrix of a stage shape, indexed [start, end] and [start, length - 1]
    (ranges past the model's end hold `missing`); for fit matrices, the longest range that
    fits with a given number of micro-batches in flight."""

    def __init__(self, by_end: np.ndarray, missing: float) -> None:
        size = by_end.shape[0]
        # Both are views of one copy of by_end padded to about twice its width (thousands
        # are kept per search): by_length[j, l] = by_end[j, j + l + 1] reads each row one
        # element further along than the last.
        padded = np.full((size, 2 * size - 1), missing, dtype=by_end.dtype)
        padded[:, :size] = by_end
        step = padded.itemsize
        self.by_end = padded[:, :size]
        self.by_length = np.lib.stride_tricks.as_strided(
            padded.ravel()[1:], shape=(size, size - 1), strides=(2 * size * step, step))
        self._longest: dict[int, int] = {}
        self._most_by_length: list[float] | None = None
        for matrix in (self.by_end, self.by_length):
            matrix.flags.writeable = False

    def longest(self, in_flight: int) -> int:
        """Layers in the longest range that fits (for a fit matrix). A range fits only if
        every shorter one from the same start does: so does the longest of each length that
        fits best, and the lengths where `in_flight` fits at some start are a prefix."""
        if in_flight not in self._longest:
            if self._most_by_length is None:
                self._most_by_length = (-self.by_length.max(axis=0)).tolist()  # ascending
            self._longest[in_flight] = bisect.bisect_right(self._most_by_length, -in_flight)
        return self._longest[in_flight]


def extract_light_together(
    sweeps: Sequence[SuffixSweep], depths: Sequence[Sequence[int]]
) -> list[dict[int, Partition | None]]:
    """`extract_light` for `depths[i]` of `sweeps[i]`, for all of them at once. The second
    DP's k-th step runs in one numpy pass over every (sweep, depth) still going, each held
    to its own bottleneck: the sweeps' k-th stages must share their point and the
    micro-batches they keep in flight (links may differ: each sweep's own stage times are
    used), as the sweeps of one point do that only price node crossings differently."""
    found: list[dict[int, Partition | None]] = [{} for _ in sweeps]
    rows: list[tuple[int, int]] = []  # (sweep, depth) of each row of the batched DP
    for i, (sweep, wanted) in enumerate(zip(sweeps, depths, strict=True)):
        for depth in wanted:
            if depth > len(sweep.best) or not np.isfinite(sweep.best[depth - 1][0]):
                found[i][depth] = None
            elif depth == 1:
                found[i][depth] = sweep.extract(1)
            elif (least := sweep.extract(depth)) is not None and sweep.lightest_possible(
                    least, depth):
                found[i][depth] = least  # no split is lighter: the second DP would tie
            else:
                rows.append((i, depth))
    if not rows:
        return found
    # Deepest first: the rows still going at step k are then a prefix, sliced, not gathered.
    rows.sort(key=lambda row: -row[1])
    num_layers = sweeps[0].tables.num_layers
    size = num_layers + 1
    owner = np.array([i for i, _ in rows])
    row_depth = [d for _, d in rows]
    limits = np.array([sweeps[i].depth_bottleneck(d) for i, d in rows])[:, None, None] * (
        1 + 1e-12)
    starts = np.arange(size)
    heaviest = np.full((len(rows), 2 * size), INF)
    heaviest[:, num_layers] = 0.0
    choices: list[np.ndarray] = []  # per step k: each going row's end for every start
    going = len(rows)
    for k in range(1, row_depth[0] + 1):
        while row_depth[going - 1] < k:
            going -= 1
        used = sorted(set(owner[:going].tolist()))
        spec = sweeps[used[0]].specs[k - 1]
        if any(sweeps[i].specs[k - 1].point is not spec.point
               or sweeps[i].specs[k - 1].in_flight != spec.in_flight for i in used):
            raise ValueError(f"the sweeps' stages {k} from the end differ in point or "
                             "micro-batches in flight: extract them one sweep at a time")
        # The k-th stage from the end starts by layer L - k, each stage behind it needing a
        # layer, so it ends by L - k + 1: only that corner of its band can be finite.
        top = num_layers - k + 1
        ends, weight, fits = sweeps[used[0]]._band(spec, top)
        width = ends.shape[1]
        which, distinct = _distinct([sweeps[i].cost_matrices[k - 1] for i in used])
        slot = which[np.searchsorted(np.array(used), owner[:going])]
        # Ranges that do not fit weigh infinity; then ranges over a row's bottleneck do.
        total = heaviest[:going, ends]
        np.maximum(total, np.where(fits, weight, INF), out=total)
        np.copyto(total, INF, where=~(_gathered(distinct, slot, top, width) <= limits[:going]))
        pick = total.argmin(axis=2)
        heaviest[:going, :top] = _picked(total, pick)
        heaviest[:going, top:size] = INF
        choices.append(starts[None, :top] + pick + 1)
        r = going - 1
        while r >= 0 and row_depth[r] == k:
            i = int(owner[r])
            found[i][k] = sweeps[i]._walk(k, [c[r] for c in choices]) if np.isfinite(
                heaviest[r, 0]) else sweeps[i].extract(k)
            r -= 1
    return found


def sweep_together(
    sweeps: Sequence[SuffixSweep],
    stages: Sequence[Callable[[int], StageSpec]],
    most: Sequence[int],
) -> None:
    """Push `stages[i](1)`, `stages[i](2)`, ... in front of `sweeps[i]`, at most `most[i]`,
    each sweep stopping once no deeper pipeline can fit or reach back to layer 0
    (`extendable`, `can_reach_first_layer`): the same result as pushing them one sweep
    after the other. Where the stages pushed k-th share their point (the micro-batches they
    keep in flight, their links and the stages behind them may differ), the step runs as
    one numpy pass over all sweeps still going, since at these sizes a step costs its
    calls more than its arithmetic."""
    going = []
    for i, sweep in enumerate(sweeps):
        if most[i] < 1:
            continue
        sweep.push(stages[i](1))  # the first in front of each: links differ (zones)
        if sweep._goes_on(most[i] - 1):
            going.append(i)
    behind = None
    k = 2
    while len(going) > 1:
        specs = [stages[i](k) for i in going]
        if _shared(specs, [sweeps[i] for i in going]):
            behind, goes_on = _step_together(
                [sweeps[i] for i in going], specs, [most[i] - k for i in going], behind)
            behind = behind[goes_on]
            going = [i for i, on in zip(going, goes_on.tolist(), strict=True) if on]
        else:  # not one shape after all: one at a time
            for i, spec in zip(going, specs, strict=True):
                sweeps[i].push(spec)
            going = [i for i in going if sweeps[i]._goes_on(most[i] - k)]
            behind = None
        k += 1
    for i in going:
        for alone in range(k, most[i] + 1):
            sweeps[i].push(stages[i](alone))
            if not sweeps[i]._goes_on(most[i] - alone):
                break


def _shared(specs: list[StageSpec], sweeps: list[SuffixSweep]) -> bool:
    """Whether these stages, pushed in front of these sweeps, have one point and fit the
    same (their links may differ: each sweep's stage times are its own)."""
    first = specs[0]
    return all(s.point is first.point and (s.link_in is None) == (first.link_in is None)
               for s in specs) and all(
        w.tables is sweeps[0].tables and w.blocking == sweeps[0].blocking
        and w.num_pipelines == sweeps[0].num_pipelines for w in sweeps)


def _step_together(
    sweeps: list[SuffixSweep],
    specs: list[StageSpec],
    more: list[int],
    behind: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One `push` into each sweep, all swept over the widest band any of them needs: the
    cells outside a sweep's own band hold infinity (its stage does not fit there, or the
    stages behind cannot cover the rest), so its minima and choices come out the same.
    `behind` holds each sweep's last best row, padded with infinity (built when None).
    Returns the new rows, padded the same way, and whether each sweep goes on."""
    first, spec = sweeps[0], specs[0]
    num_layers = first.tables.num_layers
    # Links in and out set each stage's times: a few distinct matrices among the sweeps.
    costs = [sweep._costs(s, sweep.specs[-1].link_in) for sweep, s in zip(sweeps, specs,
                                                                          strict=True)]
    which, distinct = _distinct(costs)
    fits = first._fits(spec)
    size = 2 * num_layers + 2
    if behind is None:
        behind = np.full((len(sweeps), size), INF)
        for row, sweep in zip(behind, sweeps, strict=True):
            row[:len(sweep.best[-1])] = sweep.best[-1]
    starts = [num_layers - len(s.specs) for s in sweeps]
    top = max(starts)
    in_flight = np.array([s.in_flight for s in specs])
    longest = np.array([fits.longest(s.in_flight) for s in specs])
    # Where no range fits at all, a column of infinity gives what `push` gives.
    width = max(min(int(longest.max()), top), 1)
    ends = _ends(num_layers)[:top, :width]
    total = np.maximum(_gathered(distinct, which, top, width), behind[:, ends])
    np.copyto(total, INF, where=fits.by_length[:top, :width] < in_flight[:, None, None])
    pick = total.argmin(axis=2)
    best = _picked(total, pick)
    choice = ends[_rows(top), pick]
    for r, sweep in enumerate(sweeps):
        sweep._record(specs[r], costs[r], fits, best[r, :starts[r]], choice[r, :starts[r]])
    # `_goes_on` of every sweep at once; rows past a sweep's own starts hold infinity.
    finite = best < INF
    first_finite = np.where(finite.any(axis=1), finite.argmax(axis=1), size)
    left = np.array(more)
    reaches = finite[:, 0] | ((fits.by_end[0, 1] >= in_flight) & (first_finite <= left * longest))
    goes_on = (left > 0) & finite[:, 1:].any(axis=1) & reaches
    rows = np.full((len(sweeps), size), INF)
    rows[:, :top] = best
    return rows, goes_on


def _distinct(matrices: Sequence[_Matrices]) -> tuple[np.ndarray, list[_Matrices]]:
    """The distinct matrices among `matrices` (cached ones repeat, by identity) and each
    one's index among them: stacked once, gathered per sweep."""
    index: dict[int, int] = {}
    distinct: list[_Matrices] = []
    for m in matrices:
        if id(m) not in index:
            index[id(m)] = len(distinct)
            distinct.append(m)
    return np.array([index[id(m)] for m in matrices]), distinct


def _gathered(distinct: list[_Matrices], which: np.ndarray, top: int, width: int) -> np.ndarray:
    """The [start, length - 1] corner of matrix `which[r]` for each row r; one matrix shared by
    every row is broadcast rather than copied."""
    if len(distinct) == 1:
        return distinct[0].by_length[None, :top, :width]
    return np.stack([c.by_length[:top, :width] for c in distinct])[which]


def _picked(total: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """`total`'s values at `pick` along its last axis: read by index, which takes half the
    time of a second pass over every cell (`total.min(axis=2)`)."""
    rows, starts = total.shape[:2]
    return total[_rows(rows)[:, None], _rows(starts)[None, :], pick]


@functools.cache
def _infinities(size: int) -> np.ndarray:
    row = np.full(size, INF)
    row.flags.writeable = False
    return row


@functools.cache
def _rows(size: int) -> np.ndarray:
    return np.arange(size)


@functools.cache
def _ends(num_layers: int) -> np.ndarray:
    """[start, length - 1] -> end of the range: start + length."""
    ends = np.arange(num_layers + 1)[:, None] + np.arange(1, num_layers + 1)[None, :]
    ends.flags.writeable = False
    return ends


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
    params, output = tables.params_at, tables.output_at
    stage_s = []
    for s in range(depth):
        spec = specs_from_end[depth - s - 1]
        point = spec.point
        start, end = bounds[s], bounds[s + 1]
        acts_at = point.activation_at
        state = (params[end] - params[start]) / point.tp * per_param
        acts = (acts_at[end] - acts_at[start]) * spec.in_flight
        if end <= start or state + acts > tables.capacity_bytes[point.gpu_type]:
            return None
        seconds = point.compute_at[end] - point.compute_at[start]
        if blocking:
            link_out = specs_from_end[depth - s - 2].link_in if s < depth - 1 else None
            for link, layer in ((spec.link_in if s > 0 else None, start - 1),
                                (link_out, end - 1)):
                if link is not None:
                    seconds += 2 * (link.latency_s + output[layer]
                                    * point.micro_batch / link.bytes_per_s)
        stage_s.append(seconds)
    return Partition(bounds=tuple(bounds), stage_s=tuple(stage_s))


def _least_heaviest(tables: ScenarioTables) -> np.ndarray:
    """Per stage count d, the least parameters the heaviest of d contiguous non-empty
    stages can hold (cached per search): a DP over stages, one numpy pass each."""
    key = ("least heaviest",)
    found = tables.matrices.get(key)
    if found is None:
        num_layers = tables.num_layers
        size = num_layers + 1
        params = np.asarray(tables.params, dtype=float)
        span = params[None, :] - params[:, None]  # [j, e): parameters of layers j..e-1
        empty = np.tril(np.ones((size, size), dtype=bool))  # e <= j
        span = np.where(empty, INF, span)
        least = np.full(size + 1, INF)
        rest = span[:, -1].copy()  # one stage over [j, L)
        least[1] = rest[0]
        for d in range(2, size):
            rest = np.minimum.reduce(np.maximum(span, rest[None, :]), axis=1)
            least[d] = rest[0]
        found = tables.matrices[key] = least
    return cast(np.ndarray, found)


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
