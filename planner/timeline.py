"""The operations of one pipeline, when each starts and ends: the event simulation of
docs/formats.md replayed operation by operation, for drawing (the plan viewer).

`simulate_pipeline` computes only a pipeline's finish time, in a fixed order chosen for
speed; this replays the same rules one ready operation at a time and keeps every start
and end. Its finish equals the estimate's `T_p` (a test checks it on many shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from planner.documents import Schedule
from planner.estimate import PipelineEstimate
from planner.simulate import BACKWARD, FORWARD, stage_order

__all__ = ["Phase", "Span", "pipeline_timeline", "DRAWN_SCHEDULES"]

DRAWN_SCHEDULES = frozenset({Schedule.ONE_F_ONE_B, Schedule.GPIPE})
"""Schedules whose operation order `stage_order` gives."""


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    TRANSFER = "transfer"
    """Sending or receiving an activation or gradient (part of an operation when
    transfers block; otherwise drawn on the receiving stage while it waits)."""


@dataclass(frozen=True, kw_only=True)
class Span:
    stage: int
    phase: Phase
    micro_batch: int
    start_s: float
    end_s: float


def pipeline_timeline(estimate: PipelineEstimate) -> list[Span]:
    """Every compute and transfer span of one iteration of `estimate`'s pipeline."""
    schedule = Schedule(estimate.schedule)
    if schedule not in DRAWN_SCHEDULES:
        raise ValueError(f"no timeline for the {schedule.value} schedule yet; "
                         f"drawn: {sorted(s.value for s in DRAWN_SCHEDULES)}")
    stages = estimate.stages
    num_stages, m = len(stages), estimate.num_micro_batches
    orders = [stage_order(s, num_stages, m, schedule) for s in range(num_stages)]
    done: dict[tuple[int, int, int], float] = {}
    free = [0.0] * num_stages
    position = [0] * num_stages
    spans: list[Span] = []
    while any(position[s] < len(orders[s]) for s in range(num_stages)):
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]):
                direction, i = orders[s][position[s]]
                ready = _ready(estimate, done, s, direction, i)
                if ready is None:
                    break
                end = _run(estimate, spans, s, direction, i, max(free[s], ready))
                done[s, direction, i] = free[s] = end
                position[s] += 1
                progressed = True
        assert progressed, "schedule deadlock: stage orders disagree with dependencies"
    return spans


def _transfer_s(estimate: PipelineEstimate, stage: int) -> float:
    """Transfer between `stage` and `stage + 1` (0 past either end)."""
    if stage < 0 or stage >= len(estimate.stages) - 1:
        return 0.0
    return estimate.stages[stage].transfer_to_next_s or 0.0


def _ready(estimate: PipelineEstimate, done: dict[tuple[int, int, int], float], s: int,
           direction: int, i: int) -> float | None:
    """When the input of operation (s, direction, i) is there; None if not yet computed."""
    last = len(estimate.stages) - 1
    if direction == FORWARD:
        producer, delay = ((s - 1, FORWARD, i), _transfer_s(estimate, s - 1)) if s > 0 else (None, 0.0)
    else:
        producer, delay = ((s + 1, BACKWARD, i), _transfer_s(estimate, s)) if s < last \
            else ((s, FORWARD, i), 0.0)
    if producer is None:
        return 0.0
    if producer not in done:
        return None
    return done[producer] + (0.0 if estimate.blocking_transfers else delay)


def _run(estimate: PipelineEstimate, spans: list[Span], s: int, direction: int, i: int,
         start: float) -> float:
    """Record the spans of one operation starting at `start`; its end."""
    stage = estimate.stages[s]
    if direction == FORWARD:
        compute, effective, phase = stage.forward_ms, stage.effective_forward_ms, Phase.FORWARD
    else:
        compute, effective, phase = stage.backward_ms, stage.effective_backward_ms, Phase.BACKWARD
    end = start + effective * 1e-3
    compute_end = start + compute * 1e-3
    spans.append(Span(stage=s, phase=phase, micro_batch=i, start_s=start, end_s=compute_end))
    if end > compute_end:  # blocking transfers: the rest of the operation is sending/receiving
        spans.append(Span(stage=s, phase=Phase.TRANSFER, micro_batch=i, start_s=compute_end,
                          end_s=end))
    return end
