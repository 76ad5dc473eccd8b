"""Batch shares: the search's 'most micro-batches finished by T' is exact for any clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.search.shares import galloping_most_by


class _TableClock:
    """A pipeline clock given by its times for 1, 2, ... micro-batches."""

    def __init__(self, times: list[float]) -> None:
        self.times = times

    def time_of(self, num_micro_batches: int) -> float:
        return 0.0 if num_micro_batches <= 0 else self.times[num_micro_batches - 1]


@settings(max_examples=300, deadline=None)
@given(increments=st.lists(st.floats(min_value=0.0, max_value=10.0), max_size=40),
       target=st.floats(min_value=0.0, max_value=400.0),
       guess=st.integers(min_value=-5, max_value=60))
def test_galloping_search_finds_the_most_micro_batches_from_any_guess(
    increments: list[float], target: float, guess: int
) -> None:
    times, total = [], 0.0
    for step in increments:
        total += step
        times.append(total)
    clock = _TableClock(times)
    cap = len(times)
    want = max(m for m in range(cap + 1) if clock.time_of(m) <= target)
    assert galloping_most_by(clock, target, cap, guess) == want
