"""Stored-plan reads answered from the plan cache (api/cached_reads.py) answer exactly as
the route does: same status, headers and body, same auth, counted under the same route."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Match

from api.route_table import flat_routes
from tests.api.conftest import MakeClient, fixed_solver

TOKENS = {"up": ["upload"], "pl": ["plan"]}


def stored_plan(client: TestClient, scenario: dict[str, Any], **headers: str) -> str:
    response = client.post("/v1/plans", json={"scenario": scenario}, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def read_count(client: TestClient, status: int) -> float:
    line = ('hetplan_http_requests_total{method="GET",route="/v1/plans/{plan_id}",'
            f'status="{status}"}} ')
    found = [row for row in client.get("/metrics").text.splitlines() if row.startswith(line)]
    return float(found[0].removeprefix(line)) if found else 0.0


def test_a_cached_read_answers_as_the_first_read_did(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    plan_id = stored_plan(client, scenario)
    first = client.get(f"/v1/plans/{plan_id}")  # read from the database, then cached
    cached = client.get(f"/v1/plans/{plan_id}")
    assert (cached.status_code, cached.headers.raw, cached.content) == (
        first.status_code, first.headers.raw, first.content)
    assert first.status_code == 200
    assert read_count(client, 200) == 2


def test_an_uncached_plan_or_another_path_is_left_to_the_routes(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    plan_id = stored_plan(client, scenario)
    client.get(f"/v1/plans/{plan_id}")
    assert client.get("/v1/plans/" + "0" * 32).status_code == 404
    assert client.get(f"/v1/plans/{plan_id}/scenario").status_code == 200
    assert client.get(f"/v1/plans/{plan_id}/", follow_redirects=False).status_code == 307
    assert client.delete(f"/v1/plans/{plan_id}").status_code == 405
    assert read_count(client, 404) == 1


@pytest.mark.parametrize("read_requires_token", [False, True])
def test_a_cached_read_asks_for_the_token_the_route_asks_for(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any],
        read_requires_token: bool) -> None:
    client = make_client(solver=fixed_solver(plan_document), tokens=TOKENS,
                         read_requires_token=read_requires_token)
    plan_id = stored_plan(client, scenario, Authorization="Bearer pl")
    path = f"/v1/plans/{plan_id}"
    assert client.get(path, headers={"Authorization": "Bearer up"}).status_code == 200  # cached
    assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get(path).status_code == (401 if read_requires_token else 200)
    assert client.get(path, headers={"Authorization": "Basic up"}).status_code == (
        401 if read_requires_token else 200)


def test_no_other_get_route_answers_a_plan_path(client: TestClient) -> None:
    """What lets the middleware answer `/v1/plans/<hex>` without routing it."""
    scope = {"type": "http", "method": "GET", "path": "/v1/plans/" + "0123456789abcdef" * 2,
             "root_path": ""}
    matched = [route.operation_id for route in flat_routes(client.app.router.routes)
               if isinstance(route, APIRoute) and route.matches(scope)[0] != Match.NONE]
    assert matched == ["get_plan"]
