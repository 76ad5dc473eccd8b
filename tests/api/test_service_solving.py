"""Searches in child processes: killed at their hard deadline or on cancel, their errors
answered as in the server, a dead child answered 503."""

from __future__ import annotations

import json
import os
import time

import pytest
from fastapi.testclient import TestClient

import planner
from api.errors import SearchCrashed, error_body, error_status
from api.solving import ProcessSolver, deadline_s, untimed_s
from planner.errors import InvalidScenario, Problem, SolverTimeout
from tests.api.conftest import DATA, MakeClient
from tests.api.search_stubs import (
    OUTLASTS_A_SMALL_FLEET_S,
    dies,
    needs_four_gib,
    niceness_of_search,
    outlasts_a_small_fleets_deadline,
    pid_of_search,
    pid_or_hang,
    refuses_the_scenario,
    reports_then_answers,
    runs_forever,
)

OPTIONS = planner.SearchOptions(time_limit_s=0.2)


@pytest.fixture(scope="module")
def scenario() -> planner.Scenario:
    return planner.parse_scenario(json.loads((DATA / "scenario.json").read_text()))


def test_an_idle_search_process_is_reused(scenario: planner.Scenario) -> None:
    solver = ProcessSolver(pid_of_search)  # type: ignore[arg-type]
    first = solver(scenario, OPTIONS, None)
    assert solver(scenario, OPTIONS, None) == first != os.getpid()
    solver.close()


def test_search_processes_run_below_the_server_cpu_priority(scenario: planner.Scenario
                                                            ) -> None:
    """Probes and reads come first on a busy machine: searches run `niceness` lower."""
    own = os.nice(0)
    lowered = ProcessSolver(niceness_of_search, niceness=7)  # type: ignore[arg-type]
    same = ProcessSolver(niceness_of_search, niceness=0)  # type: ignore[arg-type]
    try:
        assert lowered(scenario, OPTIONS, None) == min(own + 7, 19)
        assert same(scenario, OPTIONS, None) == own
    finally:
        lowered.close()
        same.close()


def test_a_search_process_that_overran_is_not_reused(scenario: planner.Scenario) -> None:
    solver = ProcessSolver(pid_or_hang)  # type: ignore[arg-type]
    first = solver(scenario, planner.SearchOptions(time_limit_s=5), None)
    with pytest.raises(SolverTimeout):
        solver(scenario, OPTIONS, None)
    assert solver(scenario, planner.SearchOptions(time_limit_s=5), None) != first
    solver.close()


def test_search_past_its_memory_bound_is_422_naming_the_bound(
        scenario: planner.Scenario) -> None:
    solver = ProcessSolver(needs_four_gib, max_memory_bytes=2**31)
    with pytest.raises(Exception) as raised:
        solver(scenario, OPTIONS, None)
    assert error_status(raised.value) == 422
    body = error_body(raised.value)
    assert body["error"] == "search_memory_exceeded"
    assert "2147483648 bytes" in body["message"]
    assert "HETPLAN_MAX_SEARCH_MEMORY_BYTES" in body["message"]
    solver.close()


def scaled(copies: int) -> planner.Scenario:
    """The test scenario with `copies` of every node (named apart)."""
    document = json.loads((DATA / "scenario.json").read_text())
    document["cluster"]["nodes"] = [dict(node, name=f"{node['name']}-{c}") for c in range(copies)
                                    for node in document["cluster"]["nodes"]]
    return planner.parse_scenario(document)


def test_hard_deadline_is_half_the_time_limit_again_plus_two_seconds_plus_the_untimed_steps(
        scenario: planner.Scenario) -> None:
    layers = len(scenario.model.layers)
    gpus = sum(node.gpus for node in scenario.cluster.nodes)
    assert untimed_s(scenario) == pytest.approx(3e-4 * gpus + 2.5e-5 * layers**2)
    assert deadline_s(10.0, scenario) == pytest.approx(17.0 + 3.3 * untimed_s(scenario))
    # Every step of a search that no time limit governs grows with the fleet: so does the
    # deadline, by about a millisecond per GPU.
    assert deadline_s(10.0, scaled(100)) == pytest.approx(
        deadline_s(10.0, scenario) + 3.3 * 3e-4 * 99 * gpus)


def test_search_of_a_large_fleet_is_not_killed_for_steps_its_time_limit_does_not_govern(
        scenario: planner.Scenario) -> None:
    """A 0.2 s time limit once gave every search 2.3 s: a fleet of thousands of GPUs, whose
    templates and baselines alone take seconds, was killed without a plan."""
    large = scaled(-(-8192 // sum(node.gpus for node in scenario.cluster.nodes)))
    assert deadline_s(OPTIONS.time_limit_s, scenario) < OUTLASTS_A_SMALL_FLEET_S < deadline_s(
        OPTIONS.time_limit_s, large)
    solver = ProcessSolver(outlasts_a_small_fleets_deadline)  # type: ignore[arg-type]
    assert solver(large, OPTIONS, None) != os.getpid()
    solver.close()


def test_search_past_its_hard_deadline_is_killed_and_answered_as_solver_timeout(
        scenario: planner.Scenario) -> None:
    limit_s = deadline_s(OPTIONS.time_limit_s, scenario)
    started = time.monotonic()
    with pytest.raises(SolverTimeout, match=f"hard deadline of {limit_s:.1f} s"):
        ProcessSolver(runs_forever)(scenario, OPTIONS, None)
    # Killed at its deadline, not left to run: the margin is for a loaded CI machine.
    assert limit_s <= time.monotonic() - started < limit_s + 5


def test_cancel_through_the_progress_callback_kills_the_search(
        scenario: planner.Scenario) -> None:
    class Cancelled(Exception):
        pass

    calls: list[float] = []

    def progress(fraction: float, message: str) -> None:
        calls.append(fraction)
        raise Cancelled

    started = time.monotonic()
    with pytest.raises(Cancelled):
        ProcessSolver(runs_forever)(scenario, planner.SearchOptions(time_limit_s=60), progress)
    assert time.monotonic() - started < 10  # at the first report, not at the 92 s deadline
    assert len(calls) == 1


def test_progress_of_the_search_reaches_the_caller_as_it_is_reported(
        scenario: planner.Scenario) -> None:
    """A job shows the search's own fraction and step, not the time waited."""
    calls: list[tuple[float, str]] = []
    # A time limit whose deadline no loaded machine reaches: this test is about reports.
    ProcessSolver(reports_then_answers)(scenario, planner.SearchOptions(time_limit_s=30),
                                        lambda f, m: calls.append((f, m)))
    assert ("allocating" in {m for _, m in calls}) and calls[-1] == (0.5, "allocating")
    seen = [m for _, m in calls]
    assert seen.index("templates") < seen.index("allocating")


def test_the_planner_s_own_steps_are_reported_from_its_search_process(
        scenario: planner.Scenario) -> None:
    messages: list[str] = []
    result = ProcessSolver()(scenario, planner.SearchOptions(time_limit_s=2),
                             lambda fraction, message: messages.append(message))
    assert planner.evaluate(scenario, result.plan).valid
    assert "building pipeline templates" in messages


def test_error_of_the_search_is_answered_as_the_server_would(
        scenario: planner.Scenario) -> None:
    expected = InvalidScenario([Problem(path="job.global_batch_size", message="too small",
                                        value=3)])
    with pytest.raises(Exception) as raised:
        ProcessSolver(refuses_the_scenario)(scenario, OPTIONS, None)
    assert error_status(raised.value) == error_status(expected) == 422
    assert error_body(raised.value) == error_body(expected)


def test_search_process_that_dies_is_answered_503_search_crashed(
        scenario: planner.Scenario) -> None:
    with pytest.raises(SearchCrashed) as raised:
        ProcessSolver(dies)(scenario, OPTIONS, None)
    assert error_status(raised.value) == 503
    assert raised.value.retry_after_s == 5


def test_search_in_a_child_process_answers_a_plan(scenario: planner.Scenario) -> None:
    result = ProcessSolver()(scenario, planner.SearchOptions(time_limit_s=2), None)
    assert planner.evaluate(scenario, result.plan).valid


def test_cancelled_job_whose_search_ignores_cancel_is_stopped(make_client: MakeClient) -> None:
    client = make_client(solver=ProcessSolver(runs_forever))
    document = json.loads((DATA / "scenario.json").read_text())
    job = client.post("/v1/plans?job=true", json={"scenario": document,
                                                  "options": {"time_limit_s": 60}}).json()
    assert wait_status(client, job["id"], {"running"}) == "running"
    client.post(f"/v1/jobs/{job['id']}/cancel")
    assert wait_status(client, job["id"], {"cancelled"}) == "cancelled"


def test_inline_search_past_its_hard_deadline_is_422_solver_timeout(
        make_client: MakeClient) -> None:
    client = make_client(solver=ProcessSolver(runs_forever))
    document = json.loads((DATA / "scenario.json").read_text())
    response = client.post("/v1/plans", json={"scenario": document,
                                              "options": {"time_limit_s": 0.2}})
    assert response.status_code == 422
    assert response.json()["error"] == "solver_timeout"


def wait_status(client: TestClient, job_id: str, wanted: set[str]) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = client.get(f"/v1/jobs/{job_id}").json()["status"]
        if status in wanted:
            return str(status)
        time.sleep(0.05)
    return str(status)
