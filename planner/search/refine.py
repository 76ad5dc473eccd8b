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
from planner.search.shares import galloping_most_by, least_time_shares

__all__ = ["rebalance"]


def rebalance(scenario: Scenario, plan_doc: Plan, evaluation: Evaluation) -> Plan | None:
    """The same pipelines with exact least-time batch shares, or None if nothing changes."""
    batch = scenario.job.global_batch_size
    clocks: dict[tuple[object, ...], _SimulatedClock] = {}
    for p in evaluation.pipelines:
        key = _shape_key(p)
        if key not in clocks:
            clocks[key] = _SimulatedClock(p)
    exact = least_time_shares([clocks[_shape_key(p)] for p in evaluation.pipelines], batch)
    if exact is None or exact == [p.num_micro_batches for p in evaluation.pipelines]:
        return None
    pipelines = [
        Pipeline(micro_batch_size=p.micro_batch_size, num_micro_batches=m, stages=p.stages)
        for p, m in zip(plan_doc.pipelines, exact, strict=True) if m > 0
    ]
    return plan_doc.model_copy(update={"pipelines": pipelines})


def _shape_key(estimate: PipelineEstimate) -> tuple[object, ...]:
    return (estimate.micro_batch_size, estimate.schedule,
            tuple((st.effective_forward_ms, st.effective_backward_ms, st.transfer_to_next_s,
                   st.activation_bytes / max(st.in_flight, 1), st.state_bytes, st.capacity_gib)
                  for st in estimate.stages))


class _SimulatedClock:
    """T_p(m): simulated through the warm-up, then extrapolated at the steady-state rate
    (the mean increment over a window of S + 1 micro-batches; a schedule's steady state
    may repeat with a period above one). The plan finally chosen is simulated in full."""

    def __init__(self, estimate: PipelineEstimate) -> None:
        self.estimate = estimate
        self.micro_batch = estimate.micro_batch_size
        self.limit = _max_micro_batches(estimate)
        depth = len(estimate.stages)
        self.steady, self.window = 2 * depth + 2, depth + 1
        self.period_s = max(s.effective_forward_ms + s.effective_backward_ms
                            for s in estimate.stages) * 1e-3

    @functools.cache  # noqa: B019 - one clock per pipeline shape, short-lived
    def simulated(self, m: int) -> float:
        return simulate_estimate(self.estimate, m)

    def time_of(self, m: int) -> float:
        if m <= self.steady + self.window:
            return self.simulated(m)
        end = self.steady + self.window
        slope = (self.simulated(end) - self.simulated(self.steady)) / self.window
        return self.simulated(end) + (m - end) * slope

    def most_by(self, target_s: float, cap: int) -> int:
        # Guess from the first micro-batch and the bottleneck stage, then walk to the answer.
        first = self.simulated(1)
        guess = 1 + int((target_s - first) / self.period_s) if target_s >= first else 0
        return galloping_most_by(self, target_s, cap, guess)


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
