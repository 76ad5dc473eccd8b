"""Work beside the search: a forked child where safe, a thread otherwise, one result.

A test session runs threads of its own (apps with embedded workers), so no search forks
in it: the checks that need a fork run in a fresh interpreter each (`_check_*`)."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from planner import SearchOptions, parse_scenario, plan
from planner.documents import dump_document
from planner.search import api
from planner.search.aside import Aside, can_fork
from planner.search.tables import compile_tables

DATA = Path(__file__).parent.parent / "data"
ROOT = Path(__file__).resolve().parents[2]


def _pid() -> int:
    return os.getpid()


def _check_a_forked_child_does_the_work_and_sends_it_back() -> None:
    with Aside(_pid, fork=True) as aside:
        assert aside.forked
        assert aside.result() != os.getpid()
    with Aside(_pid, fork=False) as aside:
        assert not aside.forked
        assert aside.result() == os.getpid()


def _check_what_the_child_cannot_finish_the_parent_does() -> None:
    parent = os.getpid()

    def only_here() -> int:
        if os.getpid() != parent:
            raise RuntimeError("failing in the child")
        return 7

    with Aside(only_here, fork=True) as aside:
        assert aside.result() == 7


def _beside_and_pid(scenario: Any, tables: Any) -> tuple[int, api.Beside]:
    return os.getpid(), api._beside(scenario, tables, launchers=True)


def _check_candidates_cross_from_the_child_unbuilt() -> None:
    """The baselines' candidates and grids cross the pipe as templates and placements: their
    plans, built in the parent on first use, equal those built where they were found."""
    scenario = parse_scenario(json.loads((DATA / "scenarios" / "h200x8-h100x16-a80x16-llama13b.json")
                                         .read_text()))
    tables = compile_tables(scenario)
    with Aside(functools.partial(_beside_and_pid, scenario, tables), fork=True) as aside:
        pid, crossed = aside.result()
    assert aside.forked and pid != os.getpid()  # found in the child, not redone here
    crossed_grids = [*crossed.grids.even, *crossed.grids.with_idle]
    assert all("plan" not in vars(c) for c in crossed_grids)  # none judged there: unbuilt
    here = api._beside(scenario, tables, launchers=True)
    assert crossed.launchers is not None and here.launchers is not None
    judged = [(crossed.per_type, here.per_type)] + [
        (crossed.launchers[name], here.launchers[name]) for name in here.launchers]
    pairs = ([(a, b) for there, local in judged for (a, _), (b, _) in zip(there, local,
                                                                            strict=True)]
             + list(zip(crossed_grids, [*here.grids.even, *here.grids.with_idle], strict=True)))
    assert pairs
    for there, local in pairs:
        assert there.quick_s == local.quick_s and there.origin == local.origin
        assert dump_document(there.plan) == dump_document(local.plan)


def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not can_fork()
        with Aside(_pid, fork=True) as aside:
            assert aside.result() == os.getpid()
    finally:
        stop.set()
        other.join()


def _check_leaving_early_stops_the_child() -> None:
    with Aside(lambda: time.sleep(60), fork=True) as aside:
        child = aside._pid
        assert child is not None
        os.kill(child, 0)  # running
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # killed and reaped


def _fork_from_a_daemon(answers: Any) -> None:
    with Aside(_pid, fork=True) as aside:
        answers.put((os.getpid(), aside.result()))


def _check_a_daemonic_process_forks_too() -> None:
    """The service's search processes are daemonic: multiprocessing would refuse them a
    child, a plain fork does not."""
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    daemon = context.Process(target=_fork_from_a_daemon, args=(answers,), daemon=True)
    daemon.start()
    parent, worker = answers.get(timeout=30)
    daemon.join()
    assert worker != parent


def _check_the_plan_is_the_same_with_the_baseline_forked_or_threaded() -> None:
    document = json.loads((DATA / "scenarios" / "a10x24-l4x24-gpt350m.json").read_text())
    scenario = parse_scenario(document)
    results = []
    for threshold in (10**9, 1):  # a thread, then a forked child
        api.FORK_FROM_GPUS = threshold
        results.append(plan(scenario, SearchOptions(time_limit_s=10)))
    threaded, forked = results
    assert forked.baselines == threaded.baselines
    assert forked.evaluation.iteration_s == threaded.evaluation.iteration_s
    strip = ("wall_s",)
    assert ({k: v for k, v in dump_document(forked.plan)["search"].items() if k not in strip}
            == {k: v for k, v in dump_document(threaded.plan)["search"].items() if k not in strip})
    assert dump_document(forked.plan)["pipelines"] == dump_document(threaded.plan)["pipelines"]


@pytest.mark.skipif(sys.platform != "linux", reason="searches fork on Linux only")
@pytest.mark.parametrize("check", sorted(name for name in dir() if name.startswith("_check_")))
def test_in_a_fresh_interpreter(check: str) -> None:
    code = ("from planner.search.aside import can_fork; assert can_fork(); "
            f"from tests.planner import test_aside; test_aside.{check}()")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
