"""Uploads through api.client against the real service, in process, on a temporary SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.client import HetplanClient
from api.settings import Settings
from profiles.upload import UploadFailed, idempotency_key, upload_links, upload_rows

TOKEN = "upload-token"


class FaultyTransport(httpx.BaseTransport):
    """Forwards to the in-process app, after failing the way networks do.

    `refuse`: connection refused before sending (nothing reaches the server).
    `lose_answer`: the server handles the request, then the answer is lost.
    `unavailable`: answer 503 without reaching the app.
    """

    def __init__(self, app_client: TestClient, faults: list[str]) -> None:
        self.app_client = app_client
        self.faults = list(faults)
        self.requests = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        fault = self.faults.pop(0) if self.faults else None
        if fault == "refuse":
            raise httpx.ConnectError("connection refused", request=request)
        if fault == "unavailable":
            return httpx.Response(503, json={"error": "unavailable", "message": "try later"})
        answer = self.app_client.request(request.method, request.url.raw_path.decode(),
                                         headers=dict(request.headers), content=request.read())
        if fault == "lose_answer":
            raise httpx.ReadError("connection reset after the request was sent",
                                  request=request)
        return httpx.Response(answer.status_code, headers=answer.headers,
                              content=answer.content)


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'hetplan.db'}",
                        tokens={TOKEN: ["upload"]})
    with TestClient(create_app(settings)) as client:
        yield client


def client_with(app_client: TestClient, faults: list[str], token: str = TOKEN
                ) -> tuple[HetplanClient, FaultyTransport]:
    transport = FaultyTransport(app_client, faults)
    client = HetplanClient("http://hetplan.test", token, retries=3, backoff_s=0.001,
                           transport=transport)
    return client, transport


def measured_rows(gpu_type: str = "cpu", forward_ms: float = 1.5) -> list[dict[str, Any]]:
    return [
        {"gpu_type": gpu_type, "kind": kind, "micro_batch": b, "tp": 1,
         "forward_ms": forward_ms * b, "backward_ms": 2 * forward_ms * b,
         "activation_bytes": 1000 * b, "x_source": "measured", "x_device": "cpu: test",
         "x_noisy": False, "x_forward_spread_ms": 0.01}
        for kind in ("embedding", "block", "head") for b in (1, 2)
    ]


def stored_sets(app_client: TestClient) -> list[dict[str, Any]]:
    answer = app_client.get("/v1/profiles/sets")
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]  # type: ignore[no-any-return]


def test_upload_rows_stores_one_version_with_provenance(app_client: TestClient) -> None:
    client, _ = client_with(app_client, [])
    result = upload_rows(client, measured_rows(), model="tiny-gpt",
                         provenance={"profiler": "test"})
    assert [a["count"] for a in result.answers] == [6]
    (stored,) = stored_sets(app_client)
    assert (stored["model"], stored["gpu_type"], stored["version"]) == ("tiny-gpt", "cpu", 1)
    assert stored["source"]["x_source"] == "measured"
    assert stored["source"]["profiler"] == "test"
    # The x_ fields travel in the source, since the service's rows refuse them.
    assert stored["source"]["rows"][0]["x_forward_spread_ms"] == 0.01
    rows = app_client.get("/v1/profiles", params={"model": "tiny-gpt"}).json()["data"]
    assert sorted(r["forward_ms"] for r in rows) == [1.5, 1.5, 1.5, 3.0, 3.0, 3.0]


def test_upload_retries_after_refused_connection_and_503(app_client: TestClient) -> None:
    client, transport = client_with(app_client, ["refuse", "unavailable"])
    upload_rows(client, measured_rows(), model="tiny-gpt")
    assert transport.requests == 3
    assert len(stored_sets(app_client)) == 1


def test_lost_answer_is_retried_without_storing_twice(app_client: TestClient) -> None:
    # The server stored the first attempt; the retry carries the same
    # Idempotency-Key and gets the stored answer back instead of a version 2.
    client, transport = client_with(app_client, ["lose_answer"])
    result = upload_rows(client, measured_rows(), model="tiny-gpt")
    assert transport.requests == 2
    assert result.answers[0]["version"] == 1
    assert [s["version"] for s in stored_sets(app_client)] == [1]


def test_a_second_measurement_makes_a_new_version(app_client: TestClient) -> None:
    client, _ = client_with(app_client, [])
    upload_rows(client, measured_rows(forward_ms=1.0), model="tiny-gpt")
    upload_rows(client, measured_rows(forward_ms=2.0), model="tiny-gpt")
    assert sorted(s["version"] for s in stored_sets(app_client)) == [1, 2]


def test_upload_with_negative_time_is_rejected_and_nothing_is_stored(
    app_client: TestClient,
) -> None:
    rows = measured_rows()
    rows[3]["forward_ms"] = -1.0
    client, transport = client_with(app_client, [])
    with pytest.raises(UploadFailed, match="HTTP 422"):
        upload_rows(client, rows, model="tiny-gpt")
    assert transport.requests == 1  # a rejected request is not retried
    assert stored_sets(app_client) == []


def test_upload_with_a_wrong_token_is_rejected(app_client: TestClient) -> None:
    client, _ = client_with(app_client, [], token="not-a-token")
    with pytest.raises(UploadFailed, match="HTTP 401"):
        upload_rows(client, measured_rows(), model="tiny-gpt")
    assert stored_sets(app_client) == []


def test_failure_on_the_second_gpu_type_says_what_was_stored(app_client: TestClient) -> None:
    rows = measured_rows("A100-80G") + measured_rows("cpu")
    rows[-1]["activation_bytes"] = -5
    client, _ = client_with(app_client, [])
    with pytest.raises(UploadFailed, match="stored before it: A100-80G") as failure:
        upload_rows(client, rows, model="tiny-gpt")
    assert [a["gpu_type"] for a in failure.value.stored] == ["A100-80G"]
    assert [s["gpu_type"] for s in stored_sets(app_client)] == ["A100-80G"]


def test_upload_links_stores_the_measured_links(app_client: TestClient) -> None:
    client, transport = client_with(app_client, ["lose_answer"])
    links = [{"scope": "intra_node", "gpu_type": "cpu", "bandwidth_gb_per_s": 2.5,
              "latency_us": 60.0, "x_source": "measured", "x_backend": "gloo"},
             {"scope": "inter_zone", "zones": ["east", "west"], "bandwidth_gb_per_s": 1.0,
              "latency_us": 5000.0}]
    upload_links(client, links)
    assert transport.requests == 2
    stored = app_client.get("/v1/links").json()
    assert stored["version"] == 1
    assert {link["scope"] for link in stored["links"]} == {"intra_node", "inter_zone"}


def test_invalid_link_is_rejected(app_client: TestClient) -> None:
    client, _ = client_with(app_client, [])
    with pytest.raises(UploadFailed, match="nothing was stored"):
        upload_links(client, [{"scope": "intra_node", "bandwidth_gb_per_s": 2.0,
                               "latency_us": 1.0}])  # intra_node without a GPU type
    assert app_client.get("/v1/links").status_code == 404


def test_idempotency_key_depends_on_content_only() -> None:
    assert idempotency_key("x", {"a": 1, "b": 2}) == idempotency_key("x", {"b": 2, "a": 1})
    assert idempotency_key("x", {"a": 1}) != idempotency_key("x", {"a": 2})


def test_profile_layers_command_uploads_through_the_client(
    app_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    import api.client
    from api.cli import app

    transport = FaultyTransport(app_client, ["unavailable"])

    def client_factory(base_url: str, token: str | None = None, **_: Any) -> HetplanClient:
        return HetplanClient(base_url, token, backoff_s=0.001, transport=transport)

    monkeypatch.setattr(api.client, "HetplanClient", client_factory)
    result = CliRunner().invoke(app, [
        "profile", "layers", "--model", "tiny-gpt", "--micro-batches", "1", "--repeats", "2",
        "--warmup", "0", "--upload", "http://hetplan.test", "--token", TOKEN])
    assert result.exit_code == 0, result.output
    (stored,) = stored_sets(app_client)
    assert (stored["model"], stored["gpu_type"], stored["count"]) == ("tiny-gpt", "cpu", 3)
    assert stored["source"]["x_source"] == "measured"
    assert stored["source"]["profiler"] == "hetplan profile layers"
