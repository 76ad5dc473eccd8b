"""The operations of one pipeline, when each starts and ends: the event simulation of
docs/formats.md replayed operation by operation, for drawing (the plan viewer).

`planner.simulate` computes only a pipeline's finish time, in an order chosen for
speed; this replays the same rules one ready operation at a time and keeps every start
and end, for every schedule: each stage's operation list is `stage_operations` and each
operation's input the simulation's own rule, so the two cannot drift apart. Its finish
equals the estimate's `T_p` (tests check it on many shapes and on every schedule).

An operation is drawn as its parts, in the order a stage runs them: a forward is the
chunk's layers; a backward is the forward run again (recomputation), the local head's
forward and backward (schedule `local`), then the layers' backward. Whatever the
estimate adds on top of those parts is the blocking transfers, drawn last.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from planner.documents import Schedule
from planner.estimate import ChunkedStageEstimate, PipelineEstimate
from planner.simulate import BACKWARD, FORWARD, Operation, stage_operations

# The dependency rule itself, shared rather than restated: a drawn timeline must end
# where the estimate's simulation does.
from planner.simulate import _input_of as input_of

__all__ = ["Phase", "Span", "pipeline_timeline"]

ROUNDING = 1e-12


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    """The forward run again just before its backward, on a stage that recomputes."""
    HEAD = "head"
    """The local head's forward and backward, at the start of a backward (`local`)."""
    TRANSFER = "transfer"
    """Sending and receiving, part of the operation when transfers block (when they do
    not, the receiving stage waits instead: an idle gap before the operation)."""


@dataclass(frozen=True, kw_only=True)
class Span:
    stage: int
    phase: Phase
    micro_batch: int
    start_s: float
    end_s: float
    chunk: int = 0
    """Which of the stage's chunks (interleaved-1f1b); 0 with one chunk per stage."""


@dataclass(frozen=True, kw_only=True)
class _ChunkTimes:
    """One model chunk's parts in seconds, from its stage's estimate."""

    forward_s: float
    backward_s: float
    effective_forward_s: float
    effective_backward_s: float
    recompute_s: float
    head_s: float
    transfer_to_next_s: float


def pipeline_timeline(estimate: PipelineEstimate) -> list[Span]:
    """Every compute and transfer span of one iteration of `estimate`'s pipeline."""
    schedule = Schedule(estimate.schedule)
    num_stages, m = len(estimate.stages), estimate.num_micro_batches
    num_chunks = estimate.num_chunks
    times = [_chunk_times(estimate, c) for c in range(num_stages * num_chunks)]
    orders = [stage_operations(s, num_stages, m, schedule, num_chunks)
              for s in range(num_stages)]
    done: dict[Operation, float] = {}
    free = [0.0] * num_stages
    position = [0] * num_stages
    spans: list[Span] = []
    while any(position[s] < len(orders[s]) for s in range(num_stages)):
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]):
                op = orders[s][position[s]]
                ready = _ready(op, done, times, schedule, estimate.blocking_transfers)
                if ready is None:
                    break
                done[op] = free[s] = _run(spans, op, num_stages, times[op[0]],
                                          max(free[s], ready))
                position[s] += 1
                progressed = True
        assert progressed, "schedule deadlock: stage orders disagree with dependencies"
    return spans


def _chunk_times(estimate: PipelineEstimate, c: int) -> _ChunkTimes:
    """Model chunk `c` is chunk `c // S` of stage `c % S`."""
    num_stages = len(estimate.stages)
    stage, j = estimate.stages[c % num_stages], c // num_stages
    if not isinstance(stage, ChunkedStageEstimate):  # one range, no recompute, no head
        return _ChunkTimes(
            forward_s=stage.forward_ms * 1e-3, backward_s=stage.backward_ms * 1e-3,
            effective_forward_s=stage.effective_forward_ms * 1e-3,
            effective_backward_s=stage.effective_backward_ms * 1e-3, recompute_s=0.0,
            head_s=0.0, transfer_to_next_s=stage.transfer_to_next_s or 0.0)
    head_ms = (stage.head_forward_ms or 0.0) + (stage.head_backward_ms or 0.0)
    return _ChunkTimes(
        forward_s=stage.chunk_forward_ms[j] * 1e-3, backward_s=stage.chunk_backward_ms[j] * 1e-3,
        effective_forward_s=stage.chunk_effective_forward_ms[j] * 1e-3,
        effective_backward_s=stage.chunk_effective_backward_ms[j] * 1e-3,
        recompute_s=stage.chunk_forward_ms[j] * 1e-3 if stage.recompute else 0.0,
        head_s=head_ms * 1e-3, transfer_to_next_s=stage.chunk_transfer_to_next_s[j] or 0.0)


def _ready(op: Operation, done: dict[Operation, float], times: list[_ChunkTimes],
           schedule: Schedule, blocking: bool) -> float | None:
    """When the input of `op` is there; None while its producer has not run. A transfer
    that does not block delays its consumer: forwards receive from the chunk before,
    backwards from the chunk after (nothing crosses a stage backward under `local`)."""
    producer = input_of(op, len(times), schedule)
    if producer is None:
        return 0.0
    if producer not in done:
        return None
    crosses = producer[0] != op[0]
    hop = min(op[0], producer[0])  # the transfer between chunks hop and hop + 1
    delay = times[hop].transfer_to_next_s if crosses and not blocking else 0.0
    return done[producer] + delay


def _run(spans: list[Span], op: Operation, num_stages: int, times: _ChunkTimes,
         start: float) -> float:
    """Record the parts of one operation starting at `start`; its end."""
    c, direction, i = op
    if direction == FORWARD:
        parts = [(Phase.FORWARD, times.forward_s)]
        end = start + times.effective_forward_s
    else:
        assert direction == BACKWARD
        parts = [(Phase.RECOMPUTE, times.recompute_s), (Phase.HEAD, times.head_s),
                 (Phase.BACKWARD, times.backward_s)]
        end = start + times.effective_backward_s
    cursor = start
    for phase, length_s in parts:
        if length_s > 0.0 or phase in (Phase.FORWARD, Phase.BACKWARD):
            spans.append(Span(stage=c % num_stages, chunk=c // num_stages, phase=phase,
                              micro_batch=i, start_s=cursor, end_s=cursor + length_s))
            cursor += length_s
    # Blocking transfers: the rest of the operation is sending and receiving. The parts
    # were summed in another order than the estimate's total: ignore rounding.
    if end - cursor > ROUNDING * max(1.0, end):
        spans.append(Span(stage=c % num_stages, chunk=c // num_stages, phase=Phase.TRANSFER,
                          micro_batch=i, start_s=cursor, end_s=end))
    return end
