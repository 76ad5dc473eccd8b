"""Work done beside the search, on another CPU when the process may fork.

The search is pure Python for most of its time: a second thread only takes turns with it
for the interpreter. A forked child runs truly beside it, on what the parent already
computed (no copy of its inputs is sent), and sends back its result. A fork is only
taken where it is safe and pays:

- the platform is Linux and the calling process runs no other Python thread (a fork
  copies locks held by other threads, never their owners);
- the caller judges the work large enough to repay a fork and the pickling of its result.

Otherwise the work runs on a thread. A child that fails or dies leaves the
work to the parent: the result is the same either way, only slower.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Generic, TypeVar

__all__ = ["Aside", "can_fork", "usable_cores"]

T = TypeVar("T")


def usable_cores() -> int:
    """CPUs this process may run on (its affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether a forked child is safe here: Linux (macOS system libraries are not safe to
    use in a forked child, Windows has no fork) and no other Python thread."""
    return sys.platform == "linux" and threading.active_count() == 1


class Aside(Generic[T]):
    """`work()` started now, in a forked child when `fork` is true and safe, else on a
    thread; `result()` waits for it (a child sends it pickled: it must pickle). Use as a
    context manager: leaving it stops the child (a search cancelled or failed does not
    leave it running).

    The child is forked with `os.fork`, not `multiprocessing.Process`, which refuses
    children to daemonic processes such as the service's search processes. A search
    process killed at its deadline leaves its child to finish its (bounded) work alone:
    it then finds the pipe closed and exits."""

    def __init__(self, work: Callable[[], T], *, fork: bool) -> None:
        self._work = work
        self._pid: int | None = None
        self._reader: Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._future: Future[T] | None = None
        if fork and can_fork():
            self._reader, writer = multiprocessing.Pipe(duplex=False)
            self._pid = os.fork()
            if self._pid == 0:  # the child: never returns
                self._reader.close()
                _child(work, writer)
            writer.close()
        else:
            self._thread = ThreadPoolExecutor(max_workers=1)
            self._future = self._thread.submit(work)

    @property
    def forked(self) -> bool:
        """Whether the work runs in a child process (on a core of its own) rather than on
        a thread of this one."""
        return self._thread is None

    def done(self) -> bool:
        """Whether `result()` would return without waiting."""
        if self._future is not None:
            return self._future.done()
        assert self._reader is not None
        return self._reader.poll()

    def result(self) -> T:
        if self._future is not None:
            return self._future.result()
        assert self._reader is not None
        try:
            status, value = self._reader.recv()
        except (EOFError, OSError):
            status, value = "failed", None
        self._reap()
        if status == "ok":
            return value  # type: ignore[no-any-return]
        return self._work()  # the child failed: the same work, here

    def _reap(self, *, kill: bool = False) -> None:
        if self._pid is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
        os.waitpid(self._pid, 0)
        self._pid = None

    def __enter__(self) -> Aside[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
        self._reap(kill=True)
        if self._reader is not None:
            self._reader.close()


def _child(work: Callable[[], T], writer: Connection) -> None:
    """Run in the forked child: send the outcome, then leave without running the parent's
    exit handlers (they belong to the parent's resources)."""
    try:
        try:
            result = work()
            outcome: tuple[str, object] = ("ok", result)
        except BaseException as error:  # noqa: BLE001 - reported, the parent does the work
            outcome = ("failed", repr(error))
        try:
            writer.send(outcome)
        except Exception:  # noqa: BLE001 - unpicklable: the parent does the work
            writer.send(("failed", "result could not be sent"))
    finally:
        os._exit(0)
