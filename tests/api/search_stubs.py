"""Searches that stand in for the planner in search processes (ignoring their time limit,
failing, dying, reporting). They live apart from the tests so that a new search process,
which already holds the planner, imports nothing more to run them: importing the test
module (the app, FastAPI, SQLAlchemy) took 1.2 s of a 2.4 s deadline on an idle machine."""

from __future__ import annotations

import os
import time
from typing import Any

import planner
from planner.errors import InvalidScenario, Problem


def runs_forever(scenario: planner.Scenario, options: planner.SearchOptions,
        progress: Any = None) -> Any:
    while True:  # ignores its time limit, as exact mode once did
        time.sleep(0.01)


def refuses_the_scenario(scenario: planner.Scenario, options: planner.SearchOptions,
        progress: Any = None) -> Any:
    raise InvalidScenario([Problem(path="job.global_batch_size", message="too small",
                                   value=3)])


def dies(scenario: planner.Scenario, options: planner.SearchOptions,
        progress: Any = None) -> Any:
    os._exit(9)


def pid_of_search(scenario: planner.Scenario, options: planner.SearchOptions,
        progress: Any = None) -> Any:
    return os.getpid()


def niceness_of_search(scenario: planner.Scenario, options: planner.SearchOptions,
        progress: Any = None) -> Any:
    return os.nice(0)


def pid_or_hang(scenario: planner.Scenario, options: planner.SearchOptions,
        progress: Any = None) -> Any:
    if options.time_limit_s < 1:
        runs_forever(scenario, options, progress)
    return os.getpid()


def needs_four_gib(scenario: planner.Scenario, options: planner.SearchOptions,
                   progress: Any = None) -> Any:
    return len(bytearray(4 * 2**30))


OUTLASTS_A_SMALL_FLEET_S = 2.6
"""Past the test scenario's own deadline (2.39 s at a 0.2 s limit), and far below the
8,192-GPU fleet's (10.5 s): on a loaded 2-core CI machine starting a search process and
answering took 1.8 s more than the search itself, which a 2,048-GPU fleet's 4.38 s did
not leave."""


def outlasts_a_small_fleets_deadline(scenario: planner.Scenario,
                                     options: planner.SearchOptions,
                                     progress: Any = None) -> Any:
    time.sleep(OUTLASTS_A_SMALL_FLEET_S)
    return os.getpid()


def reports_then_answers(scenario: planner.Scenario, options: planner.SearchOptions,
                         progress: Any) -> Any:
    progress(0.25, "templates")
    time.sleep(0.3)
    progress(0.5, "allocating")
    time.sleep(0.3)
    return os.getpid()
