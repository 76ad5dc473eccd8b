"""Probes, metrics and the body size limit."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.api.conftest import MakeClient


def test_healthz_answers_ok(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_names_the_database(client: TestClient, database_url: str) -> None:
    body = client.get("/readyz").json()
    assert body["status"] == "ok"
    assert body["database"] == ("sqlite" if database_url.startswith("sqlite") else "postgresql")


def test_readyz_when_the_database_is_unreachable_is_503() -> None:
    app = create_app(Settings(database_url="postgresql://nobody@127.0.0.1:1/none",
                              migrate_on_startup=False))
    with TestClient(app) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert response.headers["retry-after"] == "5"


def test_request_when_the_database_is_unreachable_is_503() -> None:
    app = create_app(Settings(database_url="postgresql://nobody@127.0.0.1:1/none",
                              migrate_on_startup=False))
    with TestClient(app) as client:
        response = client.get("/v1/gpu-types")
    assert response.status_code == 503
    assert response.json()["error"] == "storage_unavailable"
    assert response.headers["retry-after"] == "5"


def test_metrics_count_requests_by_route_template(client: TestClient) -> None:
    client.get("/v1/plans/0123abcd")
    client.get("/v1/plans/4567abcd")
    text = client.get("/metrics").text
    assert ('hetplan_http_requests_total{method="GET",route="/v1/plans/{plan_id}",'
            'status="404"} 2.0') in text
    assert "hetplan_http_request_duration_seconds_bucket" in text
    assert "hetplan_jobs_pending 0.0" in text
    assert "hetplan_solve_seconds" in text


def test_body_above_the_limit_is_413(make_client: MakeClient) -> None:
    client = make_client(max_body_bytes=2048)
    response = client.post("/v1/links", content=b"x" * 4096,
                           headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "2048 bytes" in response.json()["message"]


def test_streamed_body_above_the_limit_is_413(make_client: MakeClient) -> None:
    client = make_client(max_body_bytes=2048)

    def chunks() -> Iterator[bytes]:
        for _ in range(8):
            yield b"x" * 512

    response = client.post("/v1/links", content=chunks(),
                           headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_body_under_the_limit_is_read(make_client: MakeClient) -> None:
    client = make_client(max_body_bytes=2048)
    response = client.post("/v1/links", json={"links": [
        {"scope": "inter_node", "bandwidth_gb_per_s": 1, "latency_us": 1}]})
    assert response.status_code == 201
