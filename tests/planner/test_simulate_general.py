"""The general simulation path (any schedule, chunks per stage): it equals the closed-form
path on 1F1B and GPipe, an independent event-by-event run on every schedule, never
deadlocks on valid interleaved shapes, and its held-activation peaks are section 4's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.documents import Schedule
from planner.schedules import held_peak
from planner.simulate import (
    BACKWARD,
    FORWARD,
    _general_order,
    _input_of,
    floor_s,
    simulate_chunks,
    simulate_pipeline,
    stage_operations,
)

times = st.floats(min_value=0.01, max_value=5.0)


def _durations(data: st.DataObject, num_model_chunks: int) -> tuple[list[float], ...]:
    forward = data.draw(st.lists(times, min_size=num_model_chunks, max_size=num_model_chunks))
    backward = data.draw(st.lists(times, min_size=num_model_chunks, max_size=num_model_chunks))
    transfer = data.draw(st.lists(st.floats(0.0, 2.0), min_size=num_model_chunks - 1,
                                  max_size=num_model_chunks - 1))
    return forward, backward, transfer


@settings(max_examples=200, deadline=None)
@given(data=st.data(), num_stages=st.integers(1, 8), m=st.integers(1, 16),
       schedule=st.sampled_from([Schedule.ONE_F_ONE_B, Schedule.GPIPE]), blocking=st.booleans())
def test_general_path_equals_the_closed_form_path_on_1f1b_and_gpipe(
    data: st.DataObject, num_stages: int, m: int, schedule: Schedule, blocking: bool
) -> None:
    forward, backward, transfer = _durations(data, num_stages)
    fast = simulate_pipeline(forward, backward, transfer, m, schedule, blocking_transfers=blocking)
    general = simulate_chunks(forward, backward, transfer, num_stages, m, schedule,
                              blocking_transfers=blocking)
    assert general == fast  # bit for bit: the same operations in a different valid order


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_stages=st.integers(1, 8), groups=st.integers(1, 5),
       num_chunks=st.integers(1, 4), blocking=st.booleans())
def test_interleaved_never_deadlocks_and_one_chunk_is_1f1b(
    data: st.DataObject, num_stages: int, groups: int, num_chunks: int, blocking: bool
) -> None:
    m = num_stages * groups  # the validity rule for two chunks or more
    forward, backward, transfer = _durations(data, num_stages * num_chunks)
    interleaved = simulate_chunks(forward, backward, transfer, num_stages, m,
                                  Schedule.INTERLEAVED_1F1B, blocking_transfers=blocking)
    assert interleaved == _event_by_event(forward, backward, transfer, num_stages, m,
                                          Schedule.INTERLEAVED_1F1B, blocking)
    if num_chunks == 1:
        assert interleaved == simulate_pipeline(forward, backward, transfer, m,
                                                Schedule.ONE_F_ONE_B, blocking_transfers=blocking)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_stages=st.integers(1, 8), m=st.integers(1, 12), blocking=st.booleans())
def test_local_equals_an_event_by_event_run(
    data: st.DataObject, num_stages: int, m: int, blocking: bool
) -> None:
    forward, backward, transfer = _durations(data, num_stages)
    ours = simulate_chunks(forward, backward, transfer, num_stages, m, Schedule.LOCAL,
                           blocking_transfers=blocking)
    assert ours == _event_by_event(forward, backward, transfer, num_stages, m, Schedule.LOCAL,
                                   blocking)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), num_stages=st.integers(1, 6), groups=st.integers(1, 4),
       num_chunks=st.integers(1, 3), schedule=st.sampled_from(list(Schedule)),
       blocking=st.booleans())
def test_the_floor_is_never_above_the_simulation_and_exact_for_one_chunk(
    data: st.DataObject, num_stages: int, groups: int, num_chunks: int, schedule: Schedule,
    blocking: bool
) -> None:
    if schedule is not Schedule.INTERLEAVED_1F1B:
        num_chunks = 1
    m = num_stages * groups  # valid for every schedule and chunk count
    forward, backward, transfer = _durations(data, num_stages * num_chunks)
    simulated = simulate_chunks(forward, backward, transfer, num_stages, m, schedule,
                                blocking_transfers=blocking)
    floor = floor_s(forward, backward, transfer, num_stages, m, schedule,
                    blocking_transfers=blocking)
    assert floor <= simulated * (1 + 1e-12)  # summed in another order: rounding apart
    if num_stages * num_chunks == 1:  # one operation at a time, never waiting: its sum
        assert floor == pytest.approx(simulated, rel=1e-12)


def test_the_floor_counts_the_fill_in_front_of_and_behind_the_busiest_stage() -> None:
    """Stage 1 (3 + 5 s per micro-batch, 2 micro-batches) is the busiest. Micro-batch 0
    reaches it after stage 0's forward (1 s) and a 0.5 s transfer; after its last backward
    the gradient crosses back (0.5 s) and stage 0 runs its backward (2 s): 1.5 + 16 + 2.5.
    Under local no gradient crosses, and nothing is counted behind it."""
    args = ([1.0, 3.0], [2.0, 5.0], [0.5], 2, 2)
    assert floor_s(*args, Schedule.ONE_F_ONE_B, blocking_transfers=False) == 20.0
    assert floor_s(*args, Schedule.GPIPE, blocking_transfers=False) == 20.0
    assert floor_s(*args, Schedule.LOCAL, blocking_transfers=False) == 17.5
    # Blocking transfers are in the durations the caller passes, never waited for again.
    assert floor_s(*args, Schedule.ONE_F_ONE_B, blocking_transfers=True) == 19.0
    simulated = simulate_chunks(*args, Schedule.ONE_F_ONE_B, blocking_transfers=False)
    assert simulated >= 20.0


def test_every_interleaved_shape_up_to_eight_stages_finds_a_processing_order() -> None:
    for num_stages in range(1, 9):
        for num_chunks in range(1, 5):
            for m in range(num_stages, 4 * num_stages + 1, num_stages):
                order = _general_order(num_stages, m, Schedule.INTERLEAVED_1F1B, num_chunks)
                assert sorted(order.ops) == list(range(2 * num_stages * num_chunks * m))


def test_interleaved_order_of_two_stages_two_chunks_two_micro_batches() -> None:
    # Stage 0 warms up with min(2 * 1 + 1 * 2, 4) = 4 forwards; stage 1 with 2.
    # Forward k: chunk (k mod 4) div 2, micro-batch k mod 2; backward: chunk 1 - that.
    f, b = FORWARD, BACKWARD
    assert stage_operations(0, 2, 2, Schedule.INTERLEAVED_1F1B, 2) == [
        (0, f, 0), (0, f, 1), (2, f, 0), (2, f, 1), (2, b, 0), (2, b, 1), (0, b, 0), (0, b, 1)]
    assert stage_operations(1, 2, 2, Schedule.INTERLEAVED_1F1B, 2) == [
        (1, f, 0), (1, f, 1), (3, f, 0), (3, b, 0), (3, f, 1), (3, b, 1), (1, b, 0), (1, b, 1)]


@settings(max_examples=100, deadline=None)
@given(num_stages=st.integers(1, 10), m=st.integers(1, 20))
def test_held_peak_is_min_of_stages_left_and_m_for_1f1b_and_m_for_gpipe(
    num_stages: int, m: int
) -> None:
    for s in range(num_stages):
        held = {s: 3.0}
        one_f_one_b = stage_operations(s, num_stages, m, Schedule.ONE_F_ONE_B)
        assert held_peak(one_f_one_b, held) == (min(num_stages - s, m), 3.0 * min(num_stages - s, m))
        assert held_peak(stage_operations(s, num_stages, m, Schedule.GPIPE), held) == (m, 3.0 * m)
        assert held_peak(stage_operations(s, num_stages, m, Schedule.LOCAL), held) == (1, 3.0)


def _event_by_event(forward: list[float], backward: list[float], transfer: list[float],
                    num_stages: int, m: int, schedule: Schedule, blocking: bool) -> float:
    """Sweep the stages over and over, running each one's next operation once its input is
    done, with section 6's dependencies written out here independently."""
    last = len(forward) - 1
    num_chunks = len(forward) // num_stages
    orders = [stage_operations(s, num_stages, m, schedule, num_chunks) for s in range(num_stages)]
    done: dict[tuple[int, int, int], float] = {}
    free = [0.0] * num_stages
    position = [0] * num_stages
    while any(position[s] < len(orders[s]) for s in range(num_stages)):
        progressed = False
        for s in range(num_stages):
            if position[s] == len(orders[s]):
                continue
            c, direction, i = orders[s][position[s]]
            if direction == FORWARD:
                needs, delay = ((c - 1, FORWARD, i), transfer[c - 1]) if c > 0 else (None, 0.0)
                duration = forward[c]
            elif schedule is Schedule.LOCAL or c == last:
                needs, delay, duration = (c, FORWARD, i), 0.0, backward[c]
            else:
                needs, delay, duration = (c + 1, BACKWARD, i), transfer[c], backward[c]
            if needs is not None and needs not in done:
                continue
            ready = 0.0 if needs is None else done[needs] + (0.0 if blocking else delay)
            free[s] = max(free[s], ready) + duration
            done[(c, direction, i)] = free[s]
            position[s] += 1
            progressed = True
        assert progressed, "deadlock"
    return max(free)


@settings(max_examples=100, deadline=None)
@given(num_stages=st.integers(1, 6), per_stage=st.integers(1, 4), chunks=st.integers(1, 3),
       schedule=st.sampled_from(list(Schedule)))
def test_the_order_reads_each_operations_input_as_input_of_says(
        num_stages: int, per_stage: int, chunks: int, schedule: Schedule) -> None:
    """`_general_order` works out inputs from operation ids by arithmetic: the same as
    `_input_of`, which the timeline reads, on every schedule."""
    if schedule is not Schedule.INTERLEAVED_1F1B:
        chunks = 1
    m = num_stages * per_stage  # interleaving needs a multiple of the depth
    order = _general_order(num_stages, m, schedule, chunks)
    model_chunks = num_stages * chunks

    def op_of(op_id: int) -> tuple[int, int, int]:
        kind, i = divmod(op_id, m)
        return (kind // 2, kind % 2, i)

    for op_id, producer in zip(order.ops, order.producer, strict=True):
        needs = _input_of(op_of(op_id), model_chunks, schedule)
        assert producer == (-1 if needs is None else (2 * needs[0] + needs[1]) * m + needs[2])
    assert sorted(order.ops) == list(range(order.num_ops))
