"""Plan searches in child processes, each under a hard deadline.

A search on a thread of the server holds the interpreter lock that the event loop needs
(probes then took hundreds of milliseconds) and cannot be stopped from outside: a search
that ignores its time limit or a cancel runs on. Here each search of the built-in planner
runs in a process forked from a server that has already imported the planner
(multiprocessing's forkserver: no copy of the API process's threads or connections), and
the caller only waits on a pipe. The caller stops it by killing the process:

- at the hard deadline, `deadline_s(time_limit_s)`: answered as `SolverTimeout`;
- when the job's progress callback raises (a cancel): the exception propagates.

Errors are rendered in the child (`error_status`, `error_body`) and raised again in the
caller as an `ApiError` with the same answer, since planner errors do not survive pickling.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

import planner
from api.errors import SearchCrashed, error_body, error_status, rendered_error
from planner.errors import SolverTimeout
from planner.search.api import ProgressCallback

__all__ = ["ProcessSolver", "deadline_s", "start_search_server"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["planner"])
_PROGRESS_S = 0.25


def start_search_server() -> None:
    """Start the process searches are forked from (and its import of the planner) now,
    so that the first search does not wait for it."""
    forkserver.ensure_running()


def deadline_s(time_limit_s: float) -> float:
    """When a search is killed: half its time limit again, plus 2 s for start and answer."""
    return 1.5 * time_limit_s + 2.0


Search = Callable[[planner.Scenario, planner.SearchOptions], planner.PlanResult]
"""What runs in the child: `planner.plan`, or (tests) another module-level function."""


def _search(answer: Connection, search: Search, scenario: planner.Scenario,
            options: planner.SearchOptions) -> None:
    try:
        answer.send(("ok", search(scenario, options)))
    except Exception as error:  # every error goes back as the answer it would have been
        answer.send(("error", error_status(error), error_body(error)))
    finally:
        answer.close()


class ProcessSolver:
    """A `Solver` running `search` (default `planner.plan`) in a child process per search."""

    def __init__(self, search: Search = planner.plan) -> None:
        self.search = search

    def __call__(self, scenario: planner.Scenario, options: planner.SearchOptions,
                 progress: ProgressCallback | None) -> planner.PlanResult:
        receiver, sender = _CONTEXT.Pipe(duplex=False)
        process = _CONTEXT.Process(target=_search, args=(sender, self.search, scenario, options),
                                   name="hetplan-search", daemon=True)
        process.start()
        sender.close()
        try:
            return self._wait(receiver, options.time_limit_s, progress)
        finally:
            if process.is_alive():
                process.kill()
            process.join()
            receiver.close()

    @staticmethod
    def _wait(receiver: Connection, time_limit_s: float,
              progress: ProgressCallback | None) -> planner.PlanResult:
        started = time.monotonic()
        limit_s = deadline_s(time_limit_s)
        while not receiver.poll(_PROGRESS_S):
            waited_s = time.monotonic() - started
            if waited_s >= limit_s:
                raise SolverTimeout(
                    f"the search ran {waited_s:.1f} s, past the server's hard deadline of "
                    f"{limit_s:.1f} s for a {time_limit_s:g} s time limit, and was stopped; "
                    "plan a smaller scenario or drop `exact`")
            if progress is not None:  # raises to cancel; the caller then kills the search
                progress(min(waited_s / time_limit_s, 0.99), f"searching ({waited_s:.0f} s)")
        try:
            message: Any = receiver.recv()
        except EOFError:
            raise SearchCrashed("the search process ended without an answer (killed, "
                                "perhaps for memory); retry, or plan a smaller scenario"
                                ) from None
        if message[0] == "ok":
            return message[1]
        raise rendered_error(message[1], message[2])
