"""Batch shares: micro-batches per pipeline that finish the global batch soonest.

Given each pipeline's time for m micro-batches (non-decreasing in m), the least
finishing time T at which the pipelines cover the batch is found by bisection,
each pipeline taking the most micro-batches it finishes by T (binary search),
then shares are trimmed, slowest pipelines first, to sum exactly to the batch.
A pipeline that cannot finish one micro-batch by T gets none.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

__all__ = ["Timer", "least_time_shares"]

Timer = Callable[[int], float]
"""Seconds a pipeline takes for m micro-batches."""


def least_time_shares(
    timers: Sequence[Timer], sizes: Sequence[int], limits: Sequence[int], batch: int
) -> list[int] | None:
    """Micro-batches per pipeline with sum(size * m) == batch, or None if impossible."""
    if not timers:
        return None
    low = 0.0
    high = max(timer(min(limit, -(-batch // b)))
               for timer, b, limit in zip(timers, sizes, limits, strict=True))
    counts = _counts_by(high, timers, sizes, limits, batch)
    if _covered(counts, sizes) < batch:
        return None
    for _ in range(60):
        middle = (low + high) / 2
        trial = _counts_by(middle, timers, sizes, limits, batch)
        if _covered(trial, sizes) >= batch:
            high, counts = middle, trial
        else:
            low = middle
        if high - low <= 1e-12 * high:
            break
    return _trim(counts, sizes, timers, batch)


def _covered(counts: Sequence[int], sizes: Sequence[int]) -> int:
    return sum(b * m for b, m in zip(sizes, counts, strict=True))


def _counts_by(
    target_s: float, timers: Sequence[Timer], sizes: Sequence[int], limits: Sequence[int],
    batch: int,
) -> list[int]:
    """Per pipeline, the most micro-batches it finishes by `target_s`."""
    counts = []
    for time_of, b, limit in zip(timers, sizes, limits, strict=True):
        low, high = 0, min(limit, -(-batch // b))
        while low < high:
            middle = (low + high + 1) // 2
            if time_of(middle) <= target_s:
                low = middle
            else:
                high = middle - 1
        counts.append(low)
    return counts


def _trim(
    counts: list[int], sizes: Sequence[int], timers: Sequence[Timer], batch: int
) -> list[int] | None:
    """Take micro-batches back, slowest pipelines first, until the shares sum to the batch."""
    counts = list(counts)
    excess = _covered(counts, sizes) - batch
    slowest = [(-timers[p](counts[p]), p) for p in range(len(counts)) if counts[p] > 0]
    heapq.heapify(slowest)
    skipped = []
    while excess > 0 and slowest:
        _, p = heapq.heappop(slowest)
        if sizes[p] > excess:
            skipped.append(p)  # too big a piece for what is left; a smaller one will do
            continue
        counts[p] -= 1
        excess -= sizes[p]
        if counts[p] > 0:
            heapq.heappush(slowest, (-timers[p](counts[p]), p))
    return counts if excess == 0 else None
