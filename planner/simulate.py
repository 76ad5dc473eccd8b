"""Event simulation of one pipeline's schedule (COST_MODEL.md section 3).

Each stage runs its forward and backward operations one at a time in the
schedule's fixed order; an operation starts when its stage is free and its
input has arrived. No closed formula is exact once stages are uneven, so the
estimator simulates every operation.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    num_stages = len(forward_s)
    orders = [stage_order(s, num_stages, num_micro_batches, schedule) for s in range(num_stages)]
    done = [[[-1.0] * num_micro_batches for _ in range(2)] for _ in range(num_stages)]
    position = [0] * num_stages
    free_at = [0.0] * num_stages
    delay = [0.0 if blocking_transfers else x for x in transfer_s]
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]):
                direction, i = orders[s][position[s]]
                ready = _input_ready(done, delay, s, num_stages, direction, i)
                if ready is None:
                    break
                start = max(free_at[s], ready)
                duration = forward_s[s] if direction == FORWARD else backward_s[s]
                free_at[s] = done[s][direction][i] = start + duration
                position[s] += 1
                remaining -= 1
                progressed = True
        assert progressed, "schedule deadlock: stage orders are inconsistent"
    return max(free_at)


def _input_ready(
    done: list[list[list[float]]],
    delay: list[float],
    s: int,
    num_stages: int,
    direction: int,
    i: int,
) -> float | None:
    """When the input of an operation is there, or None while its producer has not run."""
    if direction == FORWARD:
        if s == 0:
            return 0.0
        finished = done[s - 1][FORWARD][i]
        return None if finished < 0 else finished + delay[s - 1]
    if s == num_stages - 1:
        finished = done[s][FORWARD][i]
        return None if finished < 0 else finished
    finished = done[s + 1][BACKWARD][i]
    return None if finished < 0 else finished + delay[s]
