"""How spawned CPU processes split the cores."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from profiles import distributed  # noqa: E402


def test_threads_split_the_cores_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # A container limited to 4 of a 64-core host: the split is of the 4.
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert distributed.threads_per_process(2) == 2
    assert distributed.threads_per_process(4) == 1
    assert distributed.threads_per_process(8) == 1  # never below one thread
