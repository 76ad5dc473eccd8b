"""Admission control for inline plan searches.

Inline searches (201 answers) run on the thread pool that also serves every other
synchronous route. Without a bound, 64 concurrent plan requests filled it and every read
queued behind them; now at most `limit` run at once per process and the next request is
refused at once (503 `overloaded`, `Retry-After`), before it reads the database or takes
a thread. The count lives on the event loop, the only place that changes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from api.errors import Overloaded

__all__ = ["InlineSolves"]

T = TypeVar("T")


class InlineSolves:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0

    async def run(self, work: Callable[[], T]) -> T:
        """`work()` on the thread pool, or `Overloaded` when `limit` are already running."""
        if self.running >= self.limit:
            raise Overloaded(f"{self.running} inline plan searches are already running on this "
                             f"server (max_inline_solves = {self.limit}); retry after the "
                             "Retry-After delay, or ask for a job with ?job=true")
        self.running += 1
        try:
            return await run_in_threadpool(work)
        finally:
            self.running -= 1
