"""Exact batch shares for a placed plan.

The search splits the batch with the linear model fill + (m - 1) * bottleneck;
here each pipeline's real time for m micro-batches comes from the event
simulation, with its placed links. The least finishing time T at which the
pipelines cover the batch is found by bisection (each pipeline's largest m
with T_p(m) <= T by binary search), then shares are trimmed to sum exactly to
the global batch. Pipelines that cannot finish one micro-batch by T are left
out, which also shortens every sync ring.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from planner.documents import Pipeline, Plan, Scenario
from planner.estimate import Evaluation, PipelineEstimate, simulate_estimate

__all__ = ["rebalance"]


def rebalance(scenario: Scenario, plan_doc: Plan, evaluation: Evaluation) -> Plan | None:
    """The same pipelines with exact least-time batch shares, or None if nothing changes."""
    batch = scenario.job.global_batch_size
    timers = [_timer(scenario, p) for p in evaluation.pipelines]
    sizes = [p.micro_batch_size for p in evaluation.pipelines]
    limits = [_max_micro_batches(scenario, p) for p in evaluation.pipelines]
    low, high = 0.0, max(p.T_p for p in evaluation.pipelines)
    counts = _counts_by(high, timers, sizes, limits, batch)
    if sum(b * m for b, m in zip(sizes, counts, strict=True)) < batch:
        return None
    for _ in range(40):
        middle = (low + high) / 2
        trial = _counts_by(middle, timers, sizes, limits, batch)
        if sum(b * m for b, m in zip(sizes, trial, strict=True)) >= batch:
            high, counts = middle, trial
        else:
            low = middle
        if high - low <= 1e-9 * high:
            break
    exact = _trim(counts, sizes, timers, batch)
    if exact is None or exact == [p.num_micro_batches for p in evaluation.pipelines]:
        return None
    pipelines = [
        Pipeline(micro_batch_size=p.micro_batch_size, num_micro_batches=m, stages=p.stages)
        for p, m in zip(plan_doc.pipelines, exact, strict=True) if m > 0
    ]
    return plan_doc.model_copy(update={"pipelines": pipelines})


Timer = Callable[[int], float]


def _timer(scenario: Scenario, estimate: PipelineEstimate) -> Timer:
    @functools.cache
    def time_of(m: int) -> float:
        return simulate_estimate(scenario, estimate, m)

    return time_of


def _max_micro_batches(scenario: Scenario, estimate: PipelineEstimate) -> int:
    """GPipe keeps every micro-batch in flight: memory caps m. 1F1B has no cap."""
    if estimate.schedule != "gpipe":
        return 10**9
    limit = 10**9
    for stage in estimate.stages:
        per_micro_batch = stage.activation_bytes / max(stage.in_flight, 1)
        room = stage.capacity_gib * 2**30 - stage.reserved_gib * 2**30 - stage.state_bytes
        if per_micro_batch > 0:
            limit = min(limit, int(room // per_micro_batch))
    return max(limit, 0)


def _counts_by(
    target_s: float, timers: list[Timer], sizes: list[int], limits: list[int], batch: int
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


def _trim(counts: list[int], sizes: list[int], timers: list[Timer], batch: int) -> list[int] | None:
    """Take micro-batches back, slowest pipelines first, until the shares sum to the batch."""
    counts = list(counts)
    excess = sum(b * m for b, m in zip(sizes, counts, strict=True)) - batch
    while excess > 0:
        order = sorted((p for p in range(len(counts)) if counts[p] > 0 and sizes[p] <= excess),
                       key=lambda p: -timers[p](counts[p]))
        if not order:
            return None
        p = order[0]
        counts[p] -= 1
        excess -= sizes[p]
    return counts
