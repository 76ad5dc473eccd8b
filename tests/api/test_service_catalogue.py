"""GPU types, models and clusters: register, version, read, and each way to get it wrong."""

from __future__ import annotations

from fastapi.testclient import TestClient

A100 = {"name": "A100-80G", "memory_gib": 80, "peak_tflops": 312, "hourly_usd": 1.8}
MODEL = {"name": "tiny", "seq_len": 128, "layers": ["emb", "block", "block", "head"],
         "kinds": {"emb": {"params": 10, "output_bytes_per_sample": 100},
                   "block": {"params": 20, "output_bytes_per_sample": 100},
                   "head": {"params": 5, "output_bytes_per_sample": 0}}}


def test_gpu_type_is_registered_and_read_back(client: TestClient) -> None:
    created = client.post("/v1/gpu-types", json=A100)
    assert created.status_code == 201
    assert created.headers["location"] == "/v1/gpu-types/A100-80G?version=1"
    got = client.get("/v1/gpu-types/A100-80G").json()
    assert (got["memory_gib"], got["peak_tflops"], got["hourly_usd"], got["version"]) == (
        80, 312, 1.8, 1)


def test_reregistering_a_gpu_type_makes_a_new_version_and_keeps_the_old(
        client: TestClient) -> None:
    client.post("/v1/gpu-types", json=A100)
    second = client.post("/v1/gpu-types", json={**A100, "hourly_usd": 2.5}).json()
    assert second["version"] == 2
    assert client.get("/v1/gpu-types/A100-80G").json()["hourly_usd"] == 2.5
    assert client.get("/v1/gpu-types/A100-80G?version=1").json()["hourly_usd"] == 1.8
    listed = client.get("/v1/gpu-types").json()
    assert listed["count"] == 1 and listed["data"][0]["version"] == 2


def test_gpu_types_list_pages(client: TestClient) -> None:
    for i in range(3):
        client.post("/v1/gpu-types", json={**A100, "name": f"G{i}"})
    page = client.get("/v1/gpu-types?limit=2&offset=1").json()
    assert page["count"] == 3
    assert [g["name"] for g in page["data"]] == ["G1", "G2"]


def test_gpu_type_with_negative_memory_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/gpu-types", json={**A100, "memory_gib": -1})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "memory_gib"


def test_gpu_type_with_absurd_memory_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/gpu-types", json={**A100, "memory_gib": 1e12})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "memory_gib"


def test_gpu_type_with_unknown_field_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/gpu-types", json={**A100, "memory_gb": 80})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "memory_gb"


def test_missing_gpu_type_is_404(client: TestClient) -> None:
    response = client.get("/v1/gpu-types/nope")
    assert response.status_code == 404
    assert "POST /v1/gpu-types" in response.json()["message"]


def test_missing_gpu_type_version_is_404(client: TestClient) -> None:
    client.post("/v1/gpu-types", json=A100)
    assert client.get("/v1/gpu-types/A100-80G?version=2").status_code == 404


def test_model_is_registered_and_read_back(client: TestClient) -> None:
    assert client.post("/v1/models", json=MODEL).status_code == 201
    got = client.get("/v1/models/tiny").json()
    assert got["layers"] == MODEL["layers"] and got["kinds"]["block"]["params"] == 20


def test_model_with_layer_of_undeclared_kind_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/models", json={**MODEL, "layers": ["emb", "mystery"]})
    assert response.status_code == 422
    assert "mystery" in response.json()["message"]


def test_model_with_no_layers_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/models", json={**MODEL, "layers": []})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "layers"


def test_cluster_is_registered_with_known_gpu_types(client: TestClient) -> None:
    client.post("/v1/gpu-types", json=A100)
    body = {"name": "lab", "nodes": [{"name": "a0", "gpu_type": "A100-80G", "gpus": 8,
                                      "zone": "east"}]}
    assert client.post("/v1/clusters", json=body).status_code == 201
    assert client.get("/v1/clusters/lab").json()["nodes"][0]["zone"] == "east"


def test_cluster_naming_an_unregistered_gpu_type_is_rejected(client: TestClient) -> None:
    body = {"name": "lab", "nodes": [{"name": "a0", "gpu_type": "H900", "gpus": 8}]}
    response = client.post("/v1/clusters", json=body)
    assert response.status_code == 422
    assert "H900" in response.json()["message"]
    assert [(p["path"], p["value"]) for p in response.json()["problems"]] == [
        ("nodes[0].gpu_type", "H900")]
    assert client.get("/v1/clusters/lab").status_code == 404


def test_cluster_with_duplicate_node_names_is_rejected(client: TestClient) -> None:
    client.post("/v1/gpu-types", json=A100)
    node = {"name": "a0", "gpu_type": "A100-80G", "gpus": 8}
    response = client.post("/v1/clusters", json={"name": "lab", "nodes": [node, node]})
    assert response.status_code == 422
    assert "duplicate node names" in response.json()["message"]


def test_cluster_node_name_with_colon_is_rejected(client: TestClient) -> None:
    client.post("/v1/gpu-types", json=A100)
    node = {"name": "a:0", "gpu_type": "A100-80G", "gpus": 8}
    response = client.post("/v1/clusters", json={"name": "lab", "nodes": [node]})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "nodes[0].name"


def test_cluster_with_zero_gpus_on_a_node_is_rejected(client: TestClient) -> None:
    client.post("/v1/gpu-types", json=A100)
    node = {"name": "a0", "gpu_type": "A100-80G", "gpus": 0}
    response = client.post("/v1/clusters", json={"name": "lab", "nodes": [node]})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "nodes[0].gpus"


def test_malformed_json_body_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/gpu-types", content=b'{"name": ',
                           headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"
    assert response.json()["problems"][0]["path"] == "(body)"


def test_absurdly_nested_json_body_is_a_client_error(client: TestClient) -> None:
    response = client.post("/v1/gpu-types", content=b"[" * 100_000 + b"]" * 100_000,
                           headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"] == "bad_request"


def test_unknown_route_is_404_in_the_error_shape(client: TestClient) -> None:
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_name_with_a_slash_is_read_back_at_its_location(client: TestClient) -> None:
    created = client.post("/v1/gpu-types", json={"name": "A100/80G", "memory_gib": 80})
    assert created.status_code == 201
    assert created.headers["location"] == "/v1/gpu-types/A100%2F80G?version=1"
    read = client.get(created.headers["location"])
    assert read.status_code == 200
    assert read.json()["name"] == "A100/80G"
