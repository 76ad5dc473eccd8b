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
    num_stages, m = len(forward_s), num_micro_batches
    # Operations are numbered (stage, direction, micro-batch) -> (2 * stage + direction) * m + i.
    done = [-1.0] * (2 * num_stages * m)
    orders = [_order_ids(s, num_stages, m, schedule) for s in range(num_stages)]
    position = [0] * num_stages
    free_at = [0.0] * num_stages
    # Each stage runs until an input is missing, then waits on the operation that
    # produces it; finishing that operation wakes it. Every operation is handled once.
    waiting: dict[int, int] = {}
    runnable = list(range(num_stages))
    last = num_stages - 1
    while runnable:
        s = runnable.pop()
        order, pos, free = orders[s], position[s], free_at[s]
        backward_base = (2 * s + 1) * m
        f_dur, b_dur = forward_s[s], backward_s[s]
        f_delay = 0.0 if blocking_transfers or s == 0 else transfer_s[s - 1]
        b_delay = 0.0 if blocking_transfers or s == last else transfer_s[s]
        while pos < len(order):
            op = order[pos]
            if op < backward_base:  # a forward
                if s == 0:
                    ready = 0.0
                else:
                    producer = op - 2 * m
                    finished = done[producer]
                    if finished < 0:
                        waiting[producer] = s
                        break
                    ready = finished + f_delay
                duration = f_dur
            else:
                producer = op - m if s == last else op + 2 * m
                finished = done[producer]
                if finished < 0:
                    waiting[producer] = s
                    break
                ready = finished + b_delay
                duration = b_dur
            free = (free if free > ready else ready) + duration
            done[op] = free
            pos += 1
            woken = waiting.pop(op, None)
            if woken is not None:
                runnable.append(woken)
        position[s], free_at[s] = pos, free
    assert all(position[s] == len(orders[s]) for s in range(num_stages)), "schedule deadlock"
    return max(free_at)


def _order_ids(s: int, num_stages: int, m: int, schedule: Schedule) -> list[int]:
    forward, backward = 2 * s * m, (2 * s + 1) * m
    return [(forward if d == FORWARD else backward) + i
            for d, i in stage_order(s, num_stages, m, schedule)]
