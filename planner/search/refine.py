"""Exact batch shares for a placed plan.

The search splits the batch with the linear model fill + (m - 1) * bottleneck;
here each pipeline's real time for m micro-batches comes from the event
simulation, with its placed links. The shares are then those of
least finishing time (`shares.least_time_shares`); pipelines that cannot finish
one micro-batch in time are left out, which also shortens every sync ring.
"""

from __future__ import annotations

import functools

from planner.documents import Pipeline, Plan, Scenario
from planner.estimate import Evaluation, PipelineEstimate, simulate_estimate
from planner.search.shares import Timer, least_time_shares

__all__ = ["rebalance"]


def rebalance(scenario: Scenario, plan_doc: Plan, evaluation: Evaluation) -> Plan | None:
    """The same pipelines with exact least-time batch shares, or None if nothing changes."""
    batch = scenario.job.global_batch_size
    timers = [_timer(scenario, p) for p in evaluation.pipelines]
    sizes = [p.micro_batch_size for p in evaluation.pipelines]
    limits = [_max_micro_batches(p) for p in evaluation.pipelines]
    exact = least_time_shares(timers, sizes, limits, batch)
    if exact is None or exact == [p.num_micro_batches for p in evaluation.pipelines]:
        return None
    pipelines = [
        Pipeline(micro_batch_size=p.micro_batch_size, num_micro_batches=m, stages=p.stages)
        for p, m in zip(plan_doc.pipelines, exact, strict=True) if m > 0
    ]
    return plan_doc.model_copy(update={"pipelines": pipelines})


def _timer(scenario: Scenario, estimate: PipelineEstimate) -> Timer:
    @functools.cache
    def time_of(m: int) -> float:
        return simulate_estimate(scenario, estimate, m)

    return time_of


def _max_micro_batches(estimate: PipelineEstimate) -> int:
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
