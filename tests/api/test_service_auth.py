"""Bearer tokens and scopes; the refusal to serve open on a reachable address."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.settings import ExposureRefused, Settings, check_exposure
from tests.api.conftest import MakeClient

TOKENS = {"up": ["upload"], "pl": ["plan"], "root": ["admin"]}
GPU = {"name": "A100", "memory_gib": 80}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def secured(make_client: MakeClient) -> TestClient:
    return make_client(tokens=TOKENS)


def test_upload_scope_may_upload(secured: TestClient) -> None:
    assert secured.post("/v1/gpu-types", json=GPU, headers=bearer("up")).status_code == 201


def test_admin_scope_may_do_everything(secured: TestClient) -> None:
    assert secured.post("/v1/gpu-types", json=GPU, headers=bearer("root")).status_code == 201
    response = secured.post("/v1/plans", json={}, headers=bearer("root"))
    assert response.status_code == 422  # past auth, into validation


def test_upload_without_token_is_401(secured: TestClient) -> None:
    response = secured.post("/v1/gpu-types", json=GPU)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "HETPLAN_TOKENS" in response.json()["message"]


def test_upload_with_unknown_token_is_401(secured: TestClient) -> None:
    assert secured.post("/v1/gpu-types", json=GPU, headers=bearer("guess")).status_code == 401


def test_upload_with_plan_only_token_is_403(secured: TestClient) -> None:
    response = secured.post("/v1/gpu-types", json=GPU, headers=bearer("pl"))
    assert response.status_code == 403
    assert "'upload' scope" in response.json()["message"]


def test_plan_request_with_upload_only_token_is_403(secured: TestClient) -> None:
    assert secured.post("/v1/plans", json={}, headers=bearer("up")).status_code == 403
    assert secured.post("/v1/evaluate", json={"plan": {}},
                        headers=bearer("up")).status_code == 403


def test_reads_are_open_by_default_when_tokens_are_set(secured: TestClient) -> None:
    assert secured.get("/v1/gpu-types").status_code == 200


def test_reads_need_a_token_when_configured(make_client: MakeClient) -> None:
    client = make_client(tokens=TOKENS, read_requires_token=True)
    assert client.get("/v1/gpu-types").status_code == 401
    assert client.get("/v1/gpu-types", headers=bearer("pl")).status_code == 200


def test_health_probes_need_no_token(make_client: MakeClient) -> None:
    client = make_client(tokens=TOKENS, read_requires_token=True)
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200


def test_serving_without_tokens_on_a_public_address_is_refused() -> None:
    with pytest.raises(ExposureRefused, match="HETPLAN_TOKENS"):
        check_exposure("0.0.0.0", Settings())


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.5"])
def test_serving_without_tokens_on_loopback_is_allowed(host: str) -> None:
    check_exposure(host, Settings())


def test_serving_open_on_a_public_address_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    check_exposure("0.0.0.0", Settings(open=True))
    check_exposure("0.0.0.0", Settings(tokens={"t": ["admin"]}))
    monkeypatch.setenv("HETPLAN_TOKENS", '{"t": ["plan"]}')
    assert Settings().tokens == {"t": ["plan"]}


def test_empty_tokens_variable_means_no_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETPLAN_TOKENS", "")
    assert Settings().tokens == {}
