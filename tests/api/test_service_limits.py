"""Bounded work per request: admission control for inline searches, probes that never
wait for the thread pool, a size limit checked before any search, a cache bounded in
bytes."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

import planner
from api.cache import LruCache
from tests.api.conftest import MakeClient, fixed_solver


def held_solver(plan_document: dict[str, Any], started: threading.Event,
                release: threading.Event) -> Any:
    """Answers `plan_document` once released; `started` is set when a search begins."""
    answer = fixed_solver(plan_document)

    def solve(scenario: planner.Scenario, options: planner.SearchOptions, progress: Any) -> Any:
        started.set()
        assert release.wait(30)
        return answer(scenario, options, progress)

    return solve


def never_called(scenario: planner.Scenario, options: planner.SearchOptions,
                 progress: Any) -> Any:
    raise AssertionError("the search ran although the request should have been refused")


def post_in_background(client: TestClient, body: dict[str, Any]) -> tuple[threading.Thread,
                                                                          list[Any]]:
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(client.post("/v1/plans", json=body)))
    thread.start()
    return thread, answers


def test_inline_plan_beyond_max_inline_solves_is_503_with_retry_after(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    started, release = threading.Event(), threading.Event()
    client = make_client(solver=held_solver(plan_document, started, release),
                         max_inline_solves=1)
    thread, answers = post_in_background(client, {"scenario": scenario})
    try:
        assert started.wait(10)
        refused = client.post("/v1/plans", json={"scenario": scenario})
        assert refused.status_code == 503
        assert refused.json()["error"] == "overloaded"
        assert "max_inline_solves = 1" in refused.json()["message"]
        assert refused.headers["retry-after"] == "1"
    finally:
        release.set()
        thread.join(30)
    assert answers[0].status_code == 201
    assert client.post("/v1/plans", json={"scenario": scenario}).status_code == 201


def test_readyz_answers_while_every_thread_of_the_pool_is_busy(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    started, release = threading.Event(), threading.Event()
    client = make_client(solver=held_solver(plan_document, started, release),
                         max_inline_solves=1)

    def shrink_pool() -> None:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1

    client.portal.call(shrink_pool)  # type: ignore[union-attr]
    thread, _ = post_in_background(client, {"scenario": scenario})
    try:
        assert started.wait(10)  # the pool's one thread is now held by the search
        began = time.perf_counter()
        ready = client.get("/readyz")
        took_s = time.perf_counter() - began
    finally:
        release.set()
        thread.join(30)
    assert ready.status_code == 200
    assert took_s < 1.0


@pytest.mark.parametrize("job", [False, True])
def test_plan_with_more_layers_than_the_limit_is_422_naming_the_limit(
        make_client: MakeClient, scenario: dict[str, Any], job: bool) -> None:
    client = make_client(solver=never_called, max_plan_layers=25)
    response = client.post(f"/v1/plans?job={str(job).lower()}", json={"scenario": scenario})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "scenario_too_large"
    assert body["problems"] == [{"path": "model.layers", "value": 26, "message": (
        "26 layers is above this server's limit of 25 (HETPLAN_MAX_PLAN_LAYERS); profile "
        "coarser layers (e.g. one per block)")}]


def test_plan_with_more_gpus_than_the_limit_is_422_naming_the_limit(
        make_client: MakeClient, scenario: dict[str, Any]) -> None:
    client = make_client(solver=never_called, max_plan_gpus=31)
    response = client.post("/v1/plans", json={"scenario": scenario})
    assert response.status_code == 422
    assert [(p["path"], p["value"]) for p in response.json()["problems"]] == [
        ("cluster.nodes", 32)]
    assert "HETPLAN_MAX_PLAN_GPUS" in response.json()["message"]


def test_evaluation_of_a_scenario_above_the_limit_is_422(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    client = make_client(max_plan_gpus=31)
    response = client.post("/v1/evaluate", json={"scenario": scenario, "plan": plan_document})
    assert response.status_code == 422
    assert response.json()["error"] == "scenario_too_large"


def test_plan_cache_drops_least_recently_read_plans_to_stay_within_its_bytes() -> None:
    cache = LruCache(max_bytes=100)
    cache.put("a", b"a" * 40)
    cache.put("b", b"b" * 40)
    assert cache.get("a") is not None  # "b" is now the least recently read
    cache.put("c", b"c" * 40)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (b"a" * 40, None, b"c" * 40)
    assert cache.size_bytes == 80


def test_plan_cache_keeps_no_value_larger_than_itself() -> None:
    cache = LruCache(max_bytes=100)
    cache.put("a", b"a" * 60)
    cache.put("huge", b"h" * 101)
    assert (cache.get("a"), cache.get("huge"), cache.size_bytes) == (b"a" * 60, None, 60)


def test_replacing_a_cached_value_counts_its_bytes_once() -> None:
    cache = LruCache(max_bytes=100)
    cache.put("a", b"a" * 60)
    cache.put("a", b"a" * 30)
    assert cache.size_bytes == 30


def _answer(response: Any) -> tuple[int, dict[str, str], Any]:
    """Status, headers and body, less what differs between two jobs (id, times)."""
    volatile = ("id", "created_at", "updated_at")
    headers = {k: v for k, v in response.headers.items()
               if k not in ("date", "server", "location")}
    if response.status_code != 202:
        return response.status_code, headers, response.content
    return response.status_code, headers, {k: v for k, v in response.json().items()
                                           if k not in volatile}


FULL_SERVER_REQUESTS: dict[str, tuple[dict[str, str], Any]] = {
    "inline plan": ({}, {"scenario": "SCENARIO"}),
    "pieces not stored (assembled only when searched)": ({}, {"cluster": "none",
                                                             "model": "none", "job": {}}),
    "invalid options": ({}, {"scenario": "SCENARIO", "options": {"time_limit_s": "soon"}}),
    "unknown field": ({}, {"scenario": "SCENARIO", "colour": "red"}),
    "NaN in the scenario": ({}, b'{"scenario": {"model": {"seq_len": NaN}}}'),
    "not JSON": ({}, b"{"),
    "a JSON list": ({}, []),
    "not declared JSON": ({"content-type": "text/plain"}, b'{"scenario": {}}'),
    "time limit above sync_solve_threshold_s (a job)": (
        {}, {"scenario": "SCENARIO", "options": {"time_limit_s": 9}}),
    "goal in money (budget from the scenario)": (
        {}, {"scenario": "SCENARIO", "options": {"objective": "cost"}}),
    "no token": ({"authorization": ""}, {"scenario": "SCENARIO"}),
    "token without the plan scope": ({"authorization": "Bearer up"}, {"scenario": "SCENARIO"}),
}


@pytest.mark.parametrize("case", FULL_SERVER_REQUESTS)
def test_a_full_server_answers_every_plan_request_as_the_route_does(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any],
        case: str) -> None:
    """`RefuseWhenFull` answers before routing only what the route would refuse, with its
    answer: each request here gets the same answer as through the route (`?job=false`
    skips the early refusal and changes nothing else)."""
    started, release = threading.Event(), threading.Event()
    tokens = {"pl": ["plan"], "up": ["upload"]}
    client = make_client(solver=held_solver(plan_document, started, release),
                         max_inline_solves=1, tokens=tokens, sync_solve_threshold_s=5)
    client.headers["authorization"] = "Bearer pl"
    headers, body = FULL_SERVER_REQUESTS[case]
    headers = {"content-type": "application/json", **headers}
    if not isinstance(body, bytes):
        body = json.dumps(body).replace('"SCENARIO"', json.dumps(scenario)).encode()
    solves = client.app.state.inline_solves  # type: ignore[attr-defined]
    through_route = 0
    route_run = solves.run

    async def counted_run(work: Any) -> Any:
        nonlocal through_route
        through_route += 1
        return await route_run(work)

    thread, _ = post_in_background(client, {"scenario": scenario})
    try:
        assert started.wait(10)
        solves.run = counted_run
        early = client.post("/v1/plans", content=body, headers=headers)
        routed_before = through_route
        routed = client.post("/v1/plans?job=false", content=body, headers=headers)
    finally:
        release.set()
        thread.join(30)
    assert _answer(early) == _answer(routed)
    if case == "inline plan":
        assert early.status_code == 503 and early.json()["error"] == "overloaded"
        assert routed_before == 0 and through_route == 1  # refused before the route, then by it
        counted = ('hetplan_http_requests_total{method="POST",route="/v1/plans",status="503"} '
                   "2.0")
        assert counted in client.get("/metrics").text  # under the route's template, both
    else:
        assert early.status_code != 503 or routed_before == 1
