"""The pipeline simulation: its precomputed processing order, and its times against a
plain event-by-event simulation written independently here."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.documents import Schedule
from planner.simulate import BACKWARD, FORWARD, _processing_order, simulate_pipeline, stage_order

PLAIN = [Schedule.ONE_F_ONE_B, Schedule.GPIPE]
"""The schedules of one range per stage whose processing order has a closed form."""


def test_processing_order_follows_every_stage_order_and_every_dependency() -> None:
    for schedule in PLAIN:
        for num_stages in range(1, 13):
            for m in range(1, 31):
                order = _processing_order(num_stages, m, schedule)
                assert sorted(order.ops) == list(range(2 * num_stages * m))
                placed = {op: k for k, op in enumerate(order.ops)}
                for op, previous, producer in zip(order.ops, order.previous, order.producer,
                                                  strict=True):
                    assert previous < 0 or placed[previous] < placed[op]
                    assert producer < 0 or placed[producer] < placed[op]
                for s in range(num_stages):
                    ours = [(op // m % 2, op % m) for op in order.ops if op // (2 * m) == s]
                    assert ours == stage_order(s, num_stages, m, schedule)


def _plain_simulation(forward: list[float], backward: list[float], transfer: list[float],
                      m: int, schedule: Schedule, blocking: bool) -> float:
    """Sweep the stages over and over, running each one's next operation once its input
    is done, until every operation has run."""
    num_stages = len(forward)
    orders = [stage_order(s, num_stages, m, schedule) for s in range(num_stages)]
    done: dict[tuple[int, int, int], float] = {}
    free = [0.0] * num_stages
    position = [0] * num_stages
    while any(position[s] < len(orders[s]) for s in range(num_stages)):
        for s in range(num_stages):
            if position[s] == len(orders[s]):
                continue
            direction, i = orders[s][position[s]]
            if direction == FORWARD:
                needs = None if s == 0 else (s - 1, FORWARD, i)
                delay = 0.0 if blocking or s == 0 else transfer[s - 1]
                duration = forward[s]
            else:
                needs = (s, FORWARD, i) if s == num_stages - 1 else (s + 1, BACKWARD, i)
                delay = 0.0 if blocking or s == num_stages - 1 else transfer[s]
                duration = backward[s]
            if needs is not None and needs not in done:
                continue
            ready = 0.0 if needs is None else done[needs] + delay
            free[s] = max(free[s], ready) + duration
            done[(s, direction, i)] = free[s]
            position[s] += 1
    return max(free)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_stages=st.integers(1, 7), m=st.integers(1, 12),
       schedule=st.sampled_from(PLAIN), blocking=st.booleans())
def test_simulation_equals_a_plain_event_by_event_run(
    data: st.DataObject, num_stages: int, m: int, schedule: Schedule, blocking: bool
) -> None:
    times = st.floats(min_value=0.01, max_value=5.0)
    forward = data.draw(st.lists(times, min_size=num_stages, max_size=num_stages))
    backward = data.draw(st.lists(times, min_size=num_stages, max_size=num_stages))
    transfer = data.draw(st.lists(st.floats(0.0, 2.0), min_size=num_stages - 1,
                                  max_size=num_stages - 1))
    ours = simulate_pipeline(forward, backward, transfer, m, schedule, blocking_transfers=blocking)
    assert ours == _plain_simulation(forward, backward, transfer, m, schedule, blocking)
