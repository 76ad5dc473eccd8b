"""Batch shares: micro-batches per pipeline that finish the global batch soonest.

Given each pipeline's time for m micro-batches (non-decreasing in m), the least
finishing time T at which the pipelines cover the batch is found by bisection,
each pipeline taking the most micro-batches it finishes by T, then shares are
trimmed, slowest pipelines first, to sum exactly to the batch. A pipeline that
cannot finish one micro-batch by T gets none. Replicas share one `PipelineClock`,
so the work grows with the number of distinct pipeline shapes.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

__all__ = ["PipelineClock", "galloping_most_by", "least_time_shares"]


class PipelineClock(Protocol):
    micro_batch: int
    limit: int
    """Most micro-batches the pipeline may take (GPipe memory); large when unbounded."""

    def time_of(self, num_micro_batches: int) -> float: ...

    def most_by(self, target_s: float, cap: int) -> int:
        """The most micro-batches (at most `cap`) finished by `target_s`."""
        ...


def galloping_most_by(clock: PipelineClock, target_s: float, cap: int, guess: int) -> int:
    """`most_by` for any non-decreasing `time_of`, starting from a guess: steps that double
    away from it bracket the answer, which is then bisected. A good guess (from a linear
    model of the clock) costs a few calls of `time_of` instead of log2(cap)."""
    low, high = 0, cap  # time_of(low) <= target_s; the answer is in [low, high]
    probe = min(max(guess, 0), cap)
    step = 1
    if probe > 0 and clock.time_of(probe) <= target_s:
        low = probe
        while low < high:
            upper = min(low + step, high)
            if clock.time_of(upper) > target_s:
                high = upper - 1
                break
            low, step = upper, step * 2
    elif probe > 0:
        high = probe - 1
        while low < high:
            lower = max(high - step + 1, low + 1)
            if clock.time_of(lower) <= target_s:
                low = lower
                break
            high, step = lower - 1, step * 2
    while low < high:
        middle = (low + high + 1) // 2
        if clock.time_of(middle) <= target_s:
            low = middle
        else:
            high = middle - 1
    return low


def least_time_shares(clocks: Sequence[PipelineClock], batch: int) -> list[int] | None:
    """Micro-batches per pipeline with sum(b * m) == batch, or None if impossible."""
    if not clocks:
        return None
    # Replicas share a clock: bisect over the distinct ones, weighted by their copies.
    distinct: dict[int, PipelineClock] = {}
    copies: dict[int, int] = {}
    for clock in clocks:
        distinct.setdefault(id(clock), clock)
        copies[id(clock)] = copies.get(id(clock), 0) + 1
    shapes = list(distinct.values())
    weights = [copies[id(c)] for c in shapes]
    caps = [min(c.limit, -(-batch // c.micro_batch)) for c in shapes]
    low, high = 0.0, max(c.time_of(cap) for c, cap in zip(shapes, caps, strict=True))
    counts = [c.most_by(high, cap) for c, cap in zip(shapes, caps, strict=True)]
    if _covered(counts, shapes, weights) < batch:
        return None
    for _ in range(60):
        middle = (low + high) / 2
        trial = [c.most_by(middle, cap) for c, cap in zip(shapes, caps, strict=True)]
        if _covered(trial, shapes, weights) >= batch:
            high, counts = middle, trial
        else:
            low = middle
        if high - low <= 1e-12 * high:
            break
    per_shape = {id(c): m for c, m in zip(shapes, counts, strict=True)}
    return _trim([per_shape[id(c)] for c in clocks], clocks, batch)


def _covered(counts: Sequence[int], clocks: Sequence[PipelineClock],
             weights: Sequence[int] | None = None) -> int:
    weights = weights or [1] * len(clocks)
    return sum(c.micro_batch * m * w for c, m, w in zip(clocks, counts, weights, strict=True))


def _trim(counts: list[int], clocks: Sequence[PipelineClock], batch: int) -> list[int] | None:
    """Take micro-batches back, slowest pipelines first, until the shares sum to the batch."""
    counts = list(counts)
    excess = _covered(counts, clocks) - batch
    slowest = [(-clocks[p].time_of(counts[p]), p) for p in range(len(counts)) if counts[p] > 0]
    heapq.heapify(slowest)
    while excess > 0 and slowest:
        _, p = heapq.heappop(slowest)
        size = clocks[p].micro_batch
        if size > excess:
            continue  # too big a piece for what is left; a smaller one will do
        counts[p] -= 1
        excess -= size
        if counts[p] > 0:
            heapq.heappush(slowest, (-clocks[p].time_of(counts[p]), p))
    return counts if excess == 0 else None
