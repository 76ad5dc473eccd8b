"""Plan searches in search processes, each under a hard deadline.

A search on a thread of the server holds the interpreter lock that the event loop needs
(probes then took hundreds of milliseconds) and cannot be stopped from outside: a search
that ignores its time limit or a cancel runs on. Here each search of the built-in planner
runs in a search process, forked from a server that has already imported the planner
(multiprocessing's forkserver: no copy of the API process's threads or connections) and
kept for the next search while it behaves; the caller only waits on a pipe. The caller
stops a search by killing its process:

- at the hard deadline, `deadline_s(time_limit_s, scenario)`: answered as `SolverTimeout`;
- when the job's progress callback raises (a cancel): the exception propagates.

Errors are rendered in the child (`error_status`, `error_body`) and raised again in the
caller as an `ApiError` with the same answer, since planner errors do not survive pickling.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

import planner
from api.errors import (
    SearchCrashed,
    SearchMemoryExceeded,
    error_body,
    error_status,
    rendered_error,
)
from planner.errors import SolverTimeout
from planner.search.api import ProgressCallback

__all__ = ["ProcessSolver", "deadline_s", "start_search_server", "untimed_s"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["planner"])
_PROGRESS_S = 0.25


def start_search_server() -> None:
    """Start the process searches are forked from (and its import of the planner) now,
    so that the first search does not wait for it."""
    forkserver.ensure_running()


UNTIMED_S_PER_GPU = 3e-4
UNTIMED_S_PER_LAYER_PAIR = 2.5e-5
"""What the search's steps that no time limit governs (cost tables, templates, baselines,
grids) took on 2 vCPUs beyond about 0.6 s, per GPU and per layer squared (the layer
partition's matrices): 80-16,400 GPUs, 130-514 layers, BENCHMARKS 3."""
UNTIMED_MARGIN = 3.3
"""The hard deadline allows those steps this many times what they took: given 0.5 s for
4,096 GPUs a search took 3 s, and was killed at 2.75 s before they counted."""


def untimed_s(scenario: planner.Scenario) -> float:
    """About how long the search's untimed steps take on a scenario of this size, beyond
    the start every search pays."""
    gpus = scenario.cluster.num_gpus
    layers = len(scenario.model.layers)
    return UNTIMED_S_PER_GPU * gpus + UNTIMED_S_PER_LAYER_PAIR * layers * layers


def deadline_s(time_limit_s: float, scenario: planner.Scenario) -> float:
    """When a search is killed: half its time limit again, plus 2 s for start and answer,
    plus a margin over what its untimed steps take on a scenario of this size."""
    return 1.5 * time_limit_s + 2.0 + UNTIMED_MARGIN * untimed_s(scenario)


Search = Callable[[planner.Scenario, planner.SearchOptions, ProgressCallback | None],
                  planner.PlanResult]
"""What runs in the child: `planner.plan`, or (tests) another module-level function. Its
progress reports go to the caller over the pipe, as ("progress", fraction, message)."""


def _serve(requests: Connection, search: Search, max_memory_bytes: int | None,
           niceness: int) -> None:
    """A search process: answer (scenario, options) requests one at a time, until the
    server closes the pipe or kills it, or a search runs out of its memory."""
    if max_memory_bytes is not None:  # a search past it gets MemoryError, not the machine
        resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))
    if niceness:  # the server's probes and reads come first when CPUs are short
        os.nice(niceness)

    def report(fraction: float, message: str) -> None:
        requests.send(("progress", fraction, message))

    while True:
        try:
            scenario, options = requests.recv()
        except EOFError:
            return
        try:
            requests.send(("ok", search(scenario, options, report)))
        except MemoryError:
            error = SearchMemoryExceeded(
                f"the search needed more than this server's {max_memory_bytes} bytes per "
                "search (HETPLAN_MAX_SEARCH_MEMORY_BYTES) and was stopped; plan a smaller "
                "scenario (fewer layers or GPUs)")
            requests.send(("error", error_status(error), error_body(error)))
            return  # a process that ran out of memory is not trusted with another search
        except Exception as error:  # every error goes back as the answer it would have been
            requests.send(("error", error_status(error), error_body(error)))


class _SearchProcess:
    def __init__(self, search: Search, max_memory_bytes: int | None, niceness: int) -> None:
        self.pipe, theirs = _CONTEXT.Pipe()
        self.process = _CONTEXT.Process(
            target=_serve, args=(theirs, search, max_memory_bytes, niceness),
            name="hetplan-search", daemon=True)
        self.process.start()
        theirs.close()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.pipe.close()


class ProcessSolver:
    """A `Solver` running `search` (default `planner.plan`) in search processes: an idle
    one is reused (its imports and caches are warm), a new one forked when none is idle;
    one whose search overran or was cancelled is killed, and at most `max_idle` wait.
    `max_memory_bytes` bounds each search process's address space (None: no bound);
    `niceness` lowers their CPU priority below the server's (0: the same)."""

    def __init__(self, search: Search = planner.plan, *, max_idle: int = 4,
                 max_memory_bytes: int | None = None, niceness: int = 0) -> None:
        self.search = search
        self.max_idle = max_idle
        self.max_memory_bytes = max_memory_bytes
        self.niceness = niceness
        self._idle: list[_SearchProcess] = []
        self._lock = threading.Lock()

    def __call__(self, scenario: planner.Scenario, options: planner.SearchOptions,
                 progress: ProgressCallback | None) -> planner.PlanResult:
        worker = self._take()
        try:
            worker.pipe.send((scenario, options))
            answer = self._wait(worker.pipe, options.time_limit_s,
                                deadline_s(options.time_limit_s, scenario), progress)
        except BaseException:
            worker.stop()
            raise
        self._give_back(worker)
        if answer[0] == "ok":
            return answer[1]
        raise rendered_error(answer[1], answer[2])

    def close(self) -> None:
        """Stop the idle search processes (a running search ends with its caller)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def _take(self) -> _SearchProcess:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
                worker.stop()
        return _SearchProcess(self.search, self.max_memory_bytes, self.niceness)

    def _give_back(self, worker: _SearchProcess) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(worker)
                return
        worker.stop()

    @staticmethod
    def _wait(receiver: Connection, time_limit_s: float, limit_s: float,
              progress: ProgressCallback | None) -> Any:
        """The search's answer, its progress reports passed on as they come and at least
        every _PROGRESS_S (a cancel raises from `progress`)."""
        started = time.monotonic()
        fraction, message = 0.0, "searching"
        while True:
            if receiver.poll(_PROGRESS_S):
                try:
                    answer = receiver.recv()
                except EOFError:
                    raise SearchCrashed("the search process ended without an answer "
                                        "(killed, perhaps for memory); retry, or plan a "
                                        "smaller scenario") from None
                if answer[0] != "progress":
                    return answer
                fraction, message = answer[1], answer[2]
            waited_s = time.monotonic() - started
            if waited_s >= limit_s:
                raise SolverTimeout(
                    f"the search ran {waited_s:.1f} s, past the server's hard deadline of "
                    f"{limit_s:.1f} s for a {time_limit_s:g} s time limit and a scenario of "
                    "this size, and was stopped; plan a smaller scenario or drop `exact`")
            if progress is not None:  # raises to cancel; the caller then kills the search
                progress(min(fraction, 0.99), message)

