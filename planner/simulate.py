"""Event simulation of one pipeline's schedule (docs/formats.md, Schedules).

Each stage runs its forward and backward operations one at a time in the
schedule's fixed order; an operation starts when its stage is free and its
input has arrived. No closed formula is exact once stages are uneven, so the
estimator simulates every operation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    if num_stages == 0 or m <= 0:
        return 0.0
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
    none). It depends only on the shape of the schedule, so it is computed once, and the
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
    """Operations are numbered (stage, direction, micro-batch) -> (2 * stage + direction) * m + i
    and sorted by the key 2 * S * position + stage for forwards, - stage for backwards.

    Why that is a dependency order: within a stage the key grows with the position (the
    stage term is below S). A forward waits on the previous stage's forward of the same
    micro-batch, which sits at the same position there during warm-up and one position
    earlier after it; a backward waits on the next stage's backward, at the same position
    during cool-down and one earlier before it (1F1B warm-up shrinks by one per stage); under
    GPipe both sit at the same position. Equal positions are ordered by the stage term."""
    stages = np.arange(num_stages)[:, None]
    i = np.arange(m)[None, :]
    if schedule is Schedule.GPIPE:
        forward_at = np.broadcast_to(i, (num_stages, m))
        backward_at = np.broadcast_to(m + i, (num_stages, m))
    else:
        warmup = np.minimum(num_stages - 1 - stages, m)
        forward_at = np.where(i < warmup, i, 2 * i - warmup)
        backward_at = np.where(i < m - warmup, warmup + 2 * i + 1, m + i)
    forward_id = 2 * stages * m + i
    backward_id = forward_id + m
    op_at = np.empty((num_stages, 2 * m), dtype=np.int64)  # stage's operation at each position
    np.put_along_axis(op_at, forward_at, forward_id, axis=1)
    np.put_along_axis(op_at, backward_at, backward_id, axis=1)
    previous_at = np.concatenate((np.full((num_stages, 1), -1), op_at[:, :-1]), axis=1)
    # Flat arrays indexed by operation id.
    position = np.empty(2 * num_stages * m, dtype=np.int64)
    previous = np.empty_like(position)
    position[op_at] = np.arange(2 * m)[None, :]
    previous[op_at] = previous_at
    ids = np.arange(2 * num_stages * m)
    stage = ids // (2 * m)
    backward = (ids // m) % 2 == 1
    producer = np.where(backward, np.where(stage == num_stages - 1, ids - m, ids + 2 * m),
                        np.where(stage == 0, -1, ids - 2 * m))
    key = 2 * num_stages * position + np.where(backward, -stage, stage)
    ops = np.argsort(key, kind="stable")
    return _Order(num_ops=len(ids), ops=ops.tolist(), previous=previous[ops].tolist(),
                  producer=producer[ops].tolist(),
                  kind=(2 * stage + backward)[ops].tolist(), stage_last=op_at[:, -1].tolist())
