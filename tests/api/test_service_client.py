"""`api.client.HetplanClient` against a live server on loopback, and its retry rules
against a scripted transport."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

import api.client
from api.app import create_app
from api.client import HetplanClient, InvalidRequest, NotFound, ServerUnreachable, Unauthorized
from api.settings import Settings
from tests.api.conftest import fixed_solver, profile_rows

Serve = Callable[..., str]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Start the app with uvicorn on a free loopback port; returns its base URL."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(**settings: Any) -> str:
        solver = settings.pop("solver", None)
        app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'live.db'}",
                                  **settings), solver=solver)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                               log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(20)


def test_public_surface_is_pinned() -> None:
    assert sorted(api.client.__all__) == sorted([
        "HetplanClient", "HetplanError", "ServerUnreachable", "JobFailed", "ApiError",
        "Unauthorized", "NotFound", "InvalidRequest", "ServerError"])
    assert issubclass(api.client.NotFound, api.client.ApiError)
    assert issubclass(api.client.ApiError, api.client.HetplanError)


def test_profiles_and_links_upload_and_replay(serve: Serve, scenario: dict[str, Any]) -> None:
    with HetplanClient(serve()) as client:
        rows = profile_rows(scenario, "A100-80G")
        first = client.upload_profiles("gpt-1.3b", "A100-80G", rows,
                                       source={"profiler": "test"}, idempotency_key="p1")
        again = client.upload_profiles("gpt-1.3b", "A100-80G", rows,
                                       source={"profiler": "test"}, idempotency_key="p1")
        assert again == first and first["count"] == len(rows)
        fresh = client.upload_profiles("gpt-1.3b", "A100-80G", rows)  # generated key
        assert fresh["version"] == 2
        links = client.upload_links([{"scope": "inter_node", "bandwidth_gb_per_s": 25,
                                      "latency_us": 10}])
        assert links["version"] == 1


def test_create_plan_inline_and_through_a_job(serve: Serve, scenario: dict[str, Any],
                                              plan_document: dict[str, Any]) -> None:
    url = serve(solver=fixed_solver(plan_document, progress_steps=2),
                sync_solve_threshold_s=2)
    with HetplanClient(url) as client:
        inline = client.create_plan(scenario, time_limit_s=1)
        assert inline["plan"]["pipelines"] == plan_document["pipelines"]
        waited = client.create_plan(scenario, time_limit_s=10)
        assert waited["plan"]["pipelines"] == plan_document["pipelines"]
        assert waited["id"] != inline["id"]
        job = client.create_plan(scenario, time_limit_s=10, wait=False)
        assert job["status"] in ("queued", "running", "succeeded")
        assert client.get_plan(client.wait_for_job(job["id"], poll_s=0.05)["plan_id"])
        assert client.evaluate(scenario, plan_document)["valid"] is True


def test_client_errors_carry_code_and_problems(serve: Serve) -> None:
    with HetplanClient(serve()) as client:
        with pytest.raises(NotFound) as missing:
            client.get_plan("0123abcd")
        assert missing.value.status == 404 and missing.value.code == "not_found"
        with pytest.raises(InvalidRequest) as invalid:
            client.upload_links([{"scope": "inter_node", "bandwidth_gb_per_s": -1,
                                  "latency_us": 1}])
        assert invalid.value.problems[0]["path"] == "links[0].bandwidth_gb_per_s"


def test_client_with_a_wrong_token_gets_unauthorized(serve: Serve) -> None:
    url = serve(tokens={"right": ["admin"]})
    with HetplanClient(url, token="wrong") as client, pytest.raises(Unauthorized):
        client.upload_links([{"scope": "inter_node", "bandwidth_gb_per_s": 1,
                               "latency_us": 1}])
    with HetplanClient(url, token="right") as client:
        assert client.upload_links([{"scope": "inter_node", "bandwidth_gb_per_s": 1,
                                     "latency_us": 1}])["version"] == 1


def test_unreachable_server_raises_after_retries() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with HetplanClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.01) as client, \
            pytest.raises(ServerUnreachable):
        client.get_plan("0123abcd")


def scripted(statuses: list[int], seen: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = statuses.pop(0)
        return httpx.Response(status, json={"error": "x", "message": "m", "id": "1",
                                            "version": 1})

    return httpx.MockTransport(answer)


def test_uploads_are_retried_on_5xx_with_the_same_key() -> None:
    seen: list[httpx.Request] = []
    client = HetplanClient("http://hetplan.test", backoff_s=0.001,
                           transport=scripted([503, 502, 201], seen))
    with client:
        assert client.upload_links([])["version"] == 1
    keys = {r.headers["idempotency-key"] for r in seen}
    assert len(seen) == 3 and len(keys) == 1


def test_plan_requests_are_not_retried_on_5xx() -> None:
    seen: list[httpx.Request] = []
    client = HetplanClient("http://hetplan.test", backoff_s=0.001,
                           transport=scripted([503, 201], seen))
    with client, pytest.raises(api.client.ServerError):
        client.create_plan({})
    assert len(seen) == 1
