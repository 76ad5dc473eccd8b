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


def series(text: str, metric: str) -> set[str]:
    return {line.split("}")[0] for line in text.splitlines() if line.startswith(metric + "{")}


def test_made_up_methods_and_paths_add_no_metric_series(client: TestClient) -> None:
    client.get("/v1/nothing")
    client.post("/v1/plans/0123abcd")
    before = series(client.get("/metrics").text, "hetplan_http_requests_total")
    for i in range(20):
        client.request(f"MADEUP{i}", "/v1/plans")
        client.request(f"MADEUP{i}", f"/no/such/path/{i}")
        client.get(f"/v1/nothing/{i}")
        client.post("/v1/plans/0123abcd")
    text = client.get("/metrics").text
    added = series(text, "hetplan_http_requests_total") - before
    assert added == {'hetplan_http_requests_total{method="other",route="/v1/plans",status="405"',
                     'hetplan_http_requests_total{method="other",route="unmatched",status="404"',
                     'hetplan_http_requests_total{method="GET",route="/metrics",status="200"'}


def test_405_allows_every_method_its_path_serves(client: TestClient) -> None:
    response = client.delete("/v1/plans")
    assert response.status_code == 405
    assert set(response.headers["allow"].split(", ")) == {"GET", "POST"}
    assert response.json()["error"] == "method_not_allowed"


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
