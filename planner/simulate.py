"""Event simulation of one pipeline's schedule (docs/formats.md, Schedules: all versions).

Each stage runs its forward and backward operations one at a time in the
schedule's fixed order; an operation starts when its stage is free and its
input has arrived. No closed formula is exact once stages are uneven, so the
estimator simulates every operation.

Two paths share one simulation loop. 1F1B and GPipe, which the search evaluates
thousands of times, get their processing order in closed form
(`_processing_order`). Every schedule, those two included, also has a general
path: each stage's operation list (`stage_operations`) and each operation's
input (`_input_of`), sorted into a processing order by following the
dependencies (`_general_order`); tests check that both paths agree.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.documents import Schedule

__all__ = [
    "Operation",
    "stage_order",
    "stage_operations",
    "simulate_pipeline",
    "simulate_chunks",
    "floor_s",
    "ScheduleDeadlock",
]

FORWARD, BACKWARD = 0, 1

Operation = tuple[int, int, int]
"""(model chunk, direction, micro-batch). Model chunk `c = j * S + s` is chunk `j` of
stage `s`; with one chunk per stage it is the stage index."""


class ScheduleDeadlock(RuntimeError):
    """Every stage waits on an input that no stage can produce: the operation orders are
    inconsistent. Valid plans never get here (the validity rules exclude such shapes)."""


def stage_order(
    stage: int, num_stages: int, num_micro_batches: int, schedule: Schedule
) -> list[tuple[int, int]]:
    """The (direction, micro-batch) operations of one stage of one layer range, in the order
    it runs them. Interleaved 1F1B with one chunk per stage is 1F1B."""
    m = num_micro_batches
    if schedule is Schedule.LOCAL:
        return [(direction, i) for i in range(m) for direction in (FORWARD, BACKWARD)]
    if schedule is Schedule.GPIPE:
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    warmup = min(num_stages - stage - 1, m)
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order.append((FORWARD, warmup + i))
        order.append((BACKWARD, i))
    order.extend((BACKWARD, i) for i in range(m - warmup, m))
    return order


def stage_operations(
    stage: int, num_stages: int, num_micro_batches: int, schedule: Schedule, num_chunks: int = 1
) -> list[Operation]:
    """The operations of one stage in the order it runs them, for any schedule."""
    if schedule is not Schedule.INTERLEAVED_1F1B or num_chunks == 1:
        return [(stage, direction, i)
                for direction, i in stage_order(stage, num_stages, num_micro_batches, schedule)]
    return _interleaved_operations(stage, num_stages, num_micro_batches, num_chunks)


def _interleaved_operations(stage: int, num_stages: int, m: int, v: int) -> list[Operation]:
    """Megatron's interleaved order: forwards walk the chunks in groups of S micro-batches,
    backwards walk them in reverse; deeper warm-up on earlier stages."""
    if m % num_stages != 0:
        raise ValueError(f"interleaved-1f1b needs num_micro_batches ({m}) to be a multiple of "
                         f"the number of stages ({num_stages})")
    s, big_s, total = stage, num_stages, m * v

    def nth(k: int, direction: int) -> Operation:
        j = (k % (big_s * v)) // big_s
        i = (k // (big_s * v)) * big_s + k % big_s
        chunk = j if direction == FORWARD else v - 1 - j
        return (chunk * big_s + s, direction, i)

    warmup = min((big_s - s - 1) * 2 + (v - 1) * big_s, total)
    order = [nth(k, FORWARD) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(nth(warmup + k, FORWARD))
        order.append(nth(k, BACKWARD))
    order.extend(nth(k, BACKWARD) for k in range(total - warmup, total))
    return order


def simulate_chunks(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Sequence[float],
    num_stages: int,
    num_micro_batches: int,
    schedule: Schedule,
    *,
    blocking_transfers: bool,
) -> float:
    """Finish time of the last operation of a pipeline of any schedule (general path).

    `forward_s[c]`/`backward_s[c]` are the durations of one operation of model chunk `c`
    (blocking transfers, recomputation and local heads already added by the caller), so
    `len(forward_s)` is `num_stages` times the chunks per stage; `transfer_s[c]` is the
    transfer from chunk `c` to `c + 1`, a delay of the consumer only when transfers do not
    block. Under `local` nothing is sent backward.
    """
    num_model_chunks, m = len(forward_s), num_micro_batches
    if num_model_chunks == 0 or m <= 0:
        return 0.0
    order = _general_order(num_stages, m, schedule, num_model_chunks // num_stages)
    return _run(order, *_per_kind(forward_s, backward_s, transfer_s, blocking_transfers,
                                  sends_backward=schedule is not Schedule.LOCAL))


def floor_s(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Sequence[float],
    num_stages: int,
    num_micro_batches: int,
    schedule: Schedule,
    *,
    blocking_transfers: bool,
) -> float:
    """A lower bound on `simulate_chunks` (same arguments) found without simulating.

    Each stage runs its operations one at a time, and under every schedule its first is the
    forward of micro-batch 0 through its first model chunk `s` and its last the backward of
    the last micro-batch through that chunk. So no stage finishes before micro-batch 0 has
    been forwarded through chunks 0..s-1 plus all of its own work, and the pipeline not
    before that last gradient has gone back through chunks s-1..0 (under `local` no
    gradient crosses a stage). The busiest stage alone leaves out the fill, which is most
    of what separates the plans the variant step compares.
    """
    m = num_micro_batches
    if not forward_s or m <= 0:
        return 0.0
    duration, delay = _per_kind(forward_s, backward_s, transfer_s, blocking_transfers,
                                sends_backward=schedule is not Schedule.LOCAL)
    busy = [0.0] * num_stages
    for c in range(len(forward_s)):
        busy[c % num_stages] += duration[2 * c + FORWARD] + duration[2 * c + BACKWARD]
    best = ahead = behind = 0.0
    for s in range(num_stages):
        ahead += delay[2 * s + FORWARD]  # micro-batch 0 arriving at chunk s
        best = max(best, ahead + m * busy[s] + behind)
        ahead += duration[2 * s + FORWARD]
        if schedule is not Schedule.LOCAL:
            behind += delay[2 * s + BACKWARD] + duration[2 * s + BACKWARD]
    return best


def simulate_pipeline(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Sequence[float],
    num_micro_batches: int,
    schedule: Schedule,
    *,
    blocking_transfers: bool,
) -> float:
    """Finish time of the last operation of a pipeline of one layer range per stage.

    `forward_s[s]`/`backward_s[s]` are the durations of one operation of stage
    `s` (blocking transfers already added by the caller); `transfer_s[s]` is the
    transfer between stages `s` and `s+1`, which delays the consumer only when
    transfers do not block.
    """
    num_stages, m = len(forward_s), num_micro_batches
    if num_stages == 0 or m <= 0:
        return 0.0
    if schedule is Schedule.LOCAL:
        return simulate_chunks(forward_s, backward_s, transfer_s, num_stages, m, schedule,
                               blocking_transfers=blocking_transfers)
    if schedule is Schedule.INTERLEAVED_1F1B:
        schedule = Schedule.ONE_F_ONE_B  # one range per stage: interleaving is plain 1F1B
    order = _processing_order(num_stages, m, schedule)
    return _run(order, *_per_kind(forward_s, backward_s, transfer_s, blocking_transfers,
                                  sends_backward=True))


def _per_kind(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Sequence[float],
    blocking_transfers: bool,
    *,
    sends_backward: bool,
) -> tuple[list[float], list[float]]:
    """Duration and input delay per kind 2 * chunk + direction (chunk: the stage, with one
    range per stage). Only transfers that do not block delay their consumer."""
    num_chunks = len(forward_s)
    duration = [0.0] * (2 * num_chunks)
    delay = [0.0] * (2 * num_chunks)
    last = num_chunks - 1
    for c in range(num_chunks):
        duration[2 * c + FORWARD], duration[2 * c + BACKWARD] = forward_s[c], backward_s[c]
        if not blocking_transfers:
            delay[2 * c + FORWARD] = transfer_s[c - 1] if c > 0 else 0.0
            if sends_backward and c < last:
                delay[2 * c + BACKWARD] = transfer_s[c]
    return duration, delay


def _run(order: _Order, duration: list[float], delay: list[float]) -> float:
    """One pass over the processing order: each operation ends at max(stage free, input
    ready) + its duration. `duration` and `delay` are indexed by the operations' kind."""
    # done[-1] stays 0.0: the "previous operation" of a stage's first one, and the
    # "producer" of the first chunk's forwards.
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
    """2 * stage + direction (2 * model chunk + direction on the general path)."""
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


def _input_of(op: Operation, num_model_chunks: int, schedule: Schedule) -> Operation | None:
    """The operation whose result `op` needs, or None. Forwards need the previous chunk's
    forward; backwards need the next chunk's backward, the last chunk's its own forward, and
    under `local` every backward only its own forward (no gradient crosses a stage)."""
    chunk, direction, i = op
    if direction == FORWARD:
        return (chunk - 1, FORWARD, i) if chunk > 0 else None
    if schedule is Schedule.LOCAL or chunk == num_model_chunks - 1:
        return (chunk, FORWARD, i)
    return (chunk + 1, BACKWARD, i)


@functools.lru_cache(maxsize=64)
def _general_order(num_stages: int, m: int, schedule: Schedule, num_chunks: int) -> _Order:
    """A processing order found by running the stages' operation lists against their
    dependencies: sweep the stages, advancing each while its next operation's input is
    already placed. Operation (chunk c, direction d, micro-batch i) has id (2c + d) m + i."""
    num_model_chunks = num_stages * num_chunks
    lists = [stage_operations(s, num_stages, m, schedule, num_chunks) for s in range(num_stages)]
    # Operations as ids from here on: a deep interleaved pipeline has hundreds of thousands,
    # and their inputs follow from the id by arithmetic (`_input_of`, spelled out here).
    id_lists = [[(2 * chunk + direction) * m + i for chunk, direction, i in ops_of_stage]
                for ops_of_stage in lists]
    own_forward_only = schedule is Schedule.LOCAL
    last_backward = 2 * (num_model_chunks - 1) + BACKWARD

    placed = [False] * (2 * num_model_chunks * m)
    position = [0] * num_stages
    ops: list[int] = []
    previous: list[int] = []
    producer: list[int] = []
    kind: list[int] = []
    remaining = sum(len(ids) for ids in id_lists)
    while remaining:
        progressed = False
        for s, ids in enumerate(id_lists):
            at, end = position[s], len(ids)
            while at < end:
                op = ids[at]
                k = op // m  # 2 * chunk + direction
                if k % 2 == FORWARD:
                    needs = op - 2 * m if k >= 2 else -1  # the previous chunk's forward
                elif own_forward_only or k == last_backward:
                    needs = op - m  # its own forward
                else:
                    needs = op + 2 * m  # the next chunk's backward
                if needs >= 0 and not placed[needs]:
                    break
                ops.append(op)
                previous.append(ids[at - 1] if at else -1)
                producer.append(needs)
                kind.append(k)
                placed[op] = True
                at += 1
            if at > position[s]:
                remaining -= at - position[s]
                position[s] = at
                progressed = True
        if not progressed:
            waiting = [lists[s][position[s]] for s in range(num_stages)
                       if position[s] < len(lists[s])]
            raise ScheduleDeadlock(
                f"{schedule.value} with {num_stages} stage(s), {num_chunks} chunk(s) each and "
                f"{m} micro-batch(es) deadlocks: stages wait on {waiting[:4]}")
    return _Order(num_ops=len(placed), ops=ops, previous=previous, producer=producer, kind=kind,
                  stage_last=[ids[-1] for ids in id_lists])
