"""Event simulation of one pipeline's schedule (COST_MODEL.md section 3).

Each stage runs its forward and backward operations one at a time in the
schedule's fixed order; an operation starts when its stage is free and its
input has arrived. No closed formula is exact once stages are uneven, so the
estimator simulates every operation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from planner.documents import Schedule

__all__ = ["stage_order", "simulate_pipeline"]

FORWARD, BACKWARD = 0, 1


def stage_order(
    stage: int, num_stages: int, num_micro_batches: int, schedule: Schedule
) -> list[tuple[int, int]]:
    """The (direction, micro-batch) operations of one stage, in the order it runs them."""
    m = num_micro_batches
    if schedule is Schedule.GPIPE:
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    warmup = min(num_stages - stage - 1, m)
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order.append((FORWARD, warmup + i))
        order.append((BACKWARD, i))
    order.extend((BACKWARD, i) for i in range(m - warmup, m))
    return order


def simulate_pipeline(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Sequence[float],
    num_micro_batches: int,
    schedule: Schedule,
    *,
    blocking_transfers: bool,
) -> float:
    """Finish time of the last operation of a pipeline.

    `forward_s[s]`/`backward_s[s]` are the durations of one operation of stage
    `s` (blocking transfers already added by the caller); `transfer_s[s]` is the
    transfer between stages `s` and `s+1`, which delays the consumer only when
    transfers do not block.
    """
    num_stages, m = len(forward_s), num_micro_batches
    order = _processing_order(num_stages, m, schedule)
    # Per (stage, direction) = 2 * stage + direction: duration and input delay.
    duration = [0.0] * (2 * num_stages)
    delay = [0.0] * (2 * num_stages)
    last = num_stages - 1
    for s in range(num_stages):
        duration[2 * s + FORWARD], duration[2 * s + BACKWARD] = forward_s[s], backward_s[s]
        if not blocking_transfers:
            delay[2 * s + FORWARD] = transfer_s[s - 1] if s > 0 else 0.0
            delay[2 * s + BACKWARD] = transfer_s[s] if s < last else 0.0
    # done[-1] stays 0.0: the "previous operation" of a stage's first one, and the
    # "producer" of stage 0's forwards.
    done = [0.0] * (order.num_ops + 1)
    for op, previous, producer, kind in zip(order.ops, order.previous, order.producer, order.kind,
                                            strict=True):
        ready = done[producer] + delay[kind]
        free = done[previous]
        done[op] = (free if free > ready else ready) + duration[kind]
    return max(done[op] for op in order.stage_last)


@dataclass(frozen=True, kw_only=True)
class _Order:
    """A schedule's operations in an order that respects every dependency, with, for
    each, the operation before it on its stage and the one producing its input (-1:
    none). It depends only on the shape of the schedule, so it is computed once and the
    simulation is a single pass with no waiting."""

    num_ops: int
    ops: list[int]
    previous: list[int]
    producer: list[int]
    kind: list[int]
    """2 * stage + direction."""
    stage_last: list[int]
    """The last operation of every stage."""


@functools.lru_cache(maxsize=64)
def _processing_order(num_stages: int, m: int, schedule: Schedule) -> _Order:
    # Operations are numbered (stage, direction, micro-batch) -> (2 * stage + direction) * m + i.
    orders = [_order_ids(s, num_stages, m, schedule) for s in range(num_stages)]
    seen = [False] * (2 * num_stages * m)
    position = [0] * num_stages
    last = num_stages - 1
    ops: list[int] = []
    previous: list[int] = []
    producer: list[int] = []
    kind: list[int] = []
    # Each stage runs until an input is missing, then waits on the operation that
    # produces it; finishing that operation wakes it.
    waiting: dict[int, int] = {}
    runnable = list(range(num_stages))
    while runnable:
        s = runnable.pop()
        order, pos = orders[s], position[s]
        backward_base = (2 * s + 1) * m
        while pos < len(order):
            op = order[pos]
            if op < backward_base:
                needed = -1 if s == 0 else op - 2 * m
                direction = FORWARD
            else:
                needed = op - m if s == last else op + 2 * m
                direction = BACKWARD
            if needed >= 0 and not seen[needed]:
                waiting[needed] = s
                break
            ops.append(op)
            previous.append(order[pos - 1] if pos > 0 else -1)
            producer.append(needed)
            kind.append(2 * s + direction)
            seen[op] = True
            pos += 1
            woken = waiting.pop(op, None)
            if woken is not None:
                runnable.append(woken)
        position[s] = pos
    assert all(position[s] == len(orders[s]) for s in range(num_stages)), "schedule deadlock"
    return _Order(num_ops=len(seen), ops=ops, previous=previous, producer=producer, kind=kind,
                  stage_last=[order[-1] for order in orders if order])


def _order_ids(s: int, num_stages: int, m: int, schedule: Schedule) -> list[int]:
    forward, backward = 2 * s * m, (2 * s + 1) * m
    return [(forward if d == FORWARD else backward) + i
            for d, i in stage_order(s, num_stages, m, schedule)]
