"""Every client error (4xx) lists at least one problem, so a client can always show what
to change: field errors name the field, the others the request's path."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import MakeClient

GPU = {"name": "A100", "memory_gib": 80}


def assert_problems(response: httpx.Response, status: int) -> list[dict[str, Any]]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["problems"], f"{status} {body['error']} lists no problem: {body}"
    assert all(p["path"] and p["message"] for p in body["problems"]), body
    return list(body["problems"])


@pytest.mark.parametrize("method, path, body, status", [
    ("GET", "/v1/no-such-resource", None, 404),
    ("GET", "/v1/plans/0123abcd", None, 404),
    ("GET", "/v1/gpu-types/H900", None, 404),
    ("DELETE", "/v1/gpu-types", None, 405),
    ("POST", "/v1/gpu-types", {"name": "A100"}, 422),
    ("POST", "/v1/clusters", {"name": "lab", "nodes": [{"name": "a", "gpu_type": "H9",
                                                        "gpus": 1}]}, 422),
])
def test_client_errors_list_their_problems(client: TestClient, method: str, path: str,
                                           body: dict[str, Any] | None, status: int) -> None:
    assert_problems(client.request(method, path, json=body), status)


def test_auth_errors_list_their_problems(make_client: MakeClient) -> None:
    secured = make_client(tokens={"up": ["upload"]})
    assert_problems(secured.post("/v1/gpu-types", json=GPU), 401)
    assert_problems(secured.post("/v1/plans", json={},
                                 headers={"Authorization": "Bearer up"}), 403)


def test_a_body_above_the_limit_lists_its_problem(make_client: MakeClient) -> None:
    client = make_client(max_body_bytes=2048)
    problems = assert_problems(client.post("/v1/links", content=b"x" * 4096,
                                           headers={"content-type": "application/json"}), 413)
    assert problems[0]["path"] == "(body)"
