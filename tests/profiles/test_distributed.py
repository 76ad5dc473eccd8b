"""Spawned CPU processes: how they split the cores, and how progress reaches the parent."""

from __future__ import annotations

import os
from pathlib import Path

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


def _report_then_wait_for_the_parent(ctx: distributed.DistContext, flag: str) -> int:
    """Rank 0 reports a line, then waits until the parent has seen it (it writes `flag`)."""
    import time
    from pathlib import Path

    distributed.report_progress(ctx, "first")
    deadline = time.monotonic() + 30
    while ctx.rank == 0 and not Path(flag).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the parent did not see the progress line while rank 0 ran")
        time.sleep(0.05)
    distributed.report_progress(ctx, "second")
    distributed.dist.barrier()  # no rank leaves before the group is fully connected
    return ctx.rank


def test_progress_lines_reach_the_parent_while_the_processes_run(tmp_path: Path) -> None:
    flag = tmp_path / "seen"
    seen: list[str] = []

    def on_progress(line: str) -> None:
        seen.append(line)
        flag.touch()

    results = distributed.spawn(_report_then_wait_for_the_parent, world_size=2,
                                args=(str(flag),), on_progress=on_progress, timeout_s=60)
    assert results == [0, 1]
    assert seen == ["first", "second"]
