"""Profiles and links: versioned uploads, replacement without merging, idempotency,
filters and coverage, and every way to get an upload wrong."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

ROW = {"kind": "block", "micro_batch": 1, "tp": 1, "forward_ms": 2.0, "backward_ms": 4.0,
       "activation_bytes": 1000}


def upload(client: TestClient, rows: list[dict[str, Any]], *, gpu_type: str = "A100",
           model: str = "tiny", key: str | None = None, **extra: Any) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/v1/profiles", headers=headers,
                       json={"model": model, "gpu_type": gpu_type, "rows": rows, **extra})


def row(**changes: Any) -> dict[str, Any]:
    return {**ROW, **changes}


def test_upload_creates_version_one_with_its_rows(client: TestClient) -> None:
    response = upload(client, [row(), row(micro_batch=2)], source={"profiler": "test"})
    assert response.status_code == 201
    body = response.json()
    assert (body["version"], body["count"], body["uploaded"], body["replaced"]) == (1, 2, 2, 0)
    assert body["source"] == {"profiler": "test"}
    stored = client.get(response.headers["location"]).json()
    assert [(r["micro_batch"], r["forward_ms"]) for r in stored["rows"]] == [(1, 2.0), (2, 2.0)]


def test_reupload_of_a_point_replaces_it_in_a_new_version(client: TestClient) -> None:
    first = upload(client, [row(), row(micro_batch=2)]).json()
    second = upload(client, [row(forward_ms=3.0), row(micro_batch=4)]).json()
    assert (second["version"], second["count"], second["uploaded"], second["replaced"]) == (
        2, 3, 2, 1)
    new_rows = client.get(f"/v1/profiles/sets/{second['id']}").json()["rows"]
    assert {(r["micro_batch"], r["forward_ms"], r["uploaded"]) for r in new_rows} == {
        (1, 3.0, True), (2, 2.0, False), (4, 2.0, True)}
    old_rows = client.get(f"/v1/profiles/sets/{first['id']}").json()["rows"]
    assert {(r["micro_batch"], r["forward_ms"]) for r in old_rows} == {(1, 2.0), (2, 2.0)}


def test_profiles_of_other_gpu_types_and_models_are_versioned_apart(
        client: TestClient) -> None:
    upload(client, [row()])
    assert upload(client, [row()], gpu_type="V100").json()["version"] == 1
    assert upload(client, [row()], model="other").json()["version"] == 1
    assert upload(client, [row()]).json()["version"] == 2


def test_same_idempotency_key_and_body_returns_the_first_answer(client: TestClient) -> None:
    first = upload(client, [row()], key="k1")
    again = upload(client, [row()], key="k1")
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert client.get("/v1/profiles/sets").json()["count"] == 1


def test_idempotency_key_reused_with_a_different_body_is_rejected(client: TestClient) -> None:
    upload(client, [row()], key="k1")
    response = upload(client, [row(forward_ms=9.0)], key="k1")
    assert response.status_code == 422
    assert response.json()["error"] == "idempotency_key_reused"
    assert client.get("/v1/profiles/sets").json()["count"] == 1


def test_rows_are_filtered_by_model_gpu_type_and_kind(client: TestClient) -> None:
    upload(client, [row(), row(kind="head")])
    upload(client, [row()], gpu_type="V100")
    upload(client, [row(forward_ms=5.0)])  # newest A100 version replaces the block row
    rows = client.get("/v1/profiles?gpu_type=A100&kind=block").json()
    assert rows["count"] == 1
    assert (rows["data"][0]["version"], rows["data"][0]["forward_ms"]) == (2, 5.0)
    assert client.get("/v1/profiles?model=tiny").json()["count"] == 3
    assert client.get("/v1/profiles?model=nothing").json()["count"] == 0


def test_profile_sets_list_newest_first(client: TestClient) -> None:
    upload(client, [row()])
    upload(client, [row(micro_batch=2)])
    sets = client.get("/v1/profiles/sets?model=tiny&gpu_type=A100").json()
    assert [s["version"] for s in sets["data"]] == [2, 1]


def test_coverage_lists_points_and_missing_kinds(client: TestClient) -> None:
    client.post("/v1/models", json={
        "name": "tiny", "seq_len": 8, "layers": ["emb", "block", "head"],
        "kinds": {k: {"params": 1, "output_bytes_per_sample": 1} for k in ("emb", "block", "head")}})
    upload(client, [row(), row(micro_batch=2), row(kind="emb"), row(kind="emb", tp=2)])
    entry = client.get("/v1/profiles/coverage?model=tiny").json()["data"][0]
    assert entry["points"] == {"block": [[1, 1], [2, 1]], "emb": [[1, 1], [1, 2]]}
    assert entry["missing_kinds"] == ["head"]
    assert entry["complete_points"] == []  # head has no row anywhere


def test_coverage_complete_points_are_those_of_every_kind(client: TestClient) -> None:
    upload(client, [row(), row(micro_batch=2), row(kind="emb")])
    entry = client.get("/v1/profiles/coverage").json()["data"][0]
    assert entry["complete_points"] == [[1, 1]]


def test_upload_profile_with_negative_latency_time_is_rejected(client: TestClient) -> None:
    response = upload(client, [row(), row(micro_batch=2, backward_ms=-1)])
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "rows[1].backward_ms"


def test_upload_profile_with_nan_time_is_rejected(client: TestClient) -> None:
    body = (b'{"model": "m", "gpu_type": "g", "rows": [{"kind": "b", "micro_batch": 1, '
            b'"tp": 1, "forward_ms": NaN, "backward_ms": 1, "activation_bytes": 1}]}')
    response = client.post("/v1/profiles", content=body,
                           headers={"content-type": "application/json"})
    assert response.status_code == 422
    problem = response.json()["problems"][0]
    assert (problem["path"], problem["value"]) == ("rows[0].forward_ms", "nan")


def test_upload_profile_with_infinite_bytes_is_rejected(client: TestClient) -> None:
    body = (b'{"model": "m", "gpu_type": "g", "rows": [{"kind": "b", "micro_batch": 1, '
            b'"tp": 1, "forward_ms": 1, "backward_ms": 1, "activation_bytes": Infinity}]}')
    response = client.post("/v1/profiles", content=body,
                           headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "rows[0].activation_bytes"


def test_upload_profile_with_absurd_time_is_rejected(client: TestClient) -> None:
    response = upload(client, [row(forward_ms=1e9)])  # 11 days for one layer
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "rows[0].forward_ms"


def test_upload_profile_with_zero_tp_is_rejected(client: TestClient) -> None:
    response = upload(client, [row(tp=0)])
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "rows[0].tp"


def test_upload_profile_with_duplicate_points_is_rejected(client: TestClient) -> None:
    response = upload(client, [row(), row(forward_ms=3.0)])
    assert response.status_code == 422
    assert "repeats the point" in response.json()["message"]
    assert client.get("/v1/profiles/sets").json()["count"] == 0


def test_upload_profile_row_of_another_gpu_type_is_rejected(client: TestClient) -> None:
    response = upload(client, [row(gpu_type="V100")])
    assert response.status_code == 422
    assert "upload each GPU type separately" in response.json()["message"]


def test_upload_profile_with_misspelt_field_is_rejected(client: TestClient) -> None:
    bad = row()
    bad["forward_s"] = bad.pop("forward_ms")
    response = upload(client, [bad])
    assert response.status_code == 422
    paths = {p["path"] for p in response.json()["problems"]}
    assert paths == {"rows[0].forward_ms", "rows[0].forward_s"}


def test_upload_profile_with_no_rows_is_rejected(client: TestClient) -> None:
    assert upload(client, []).status_code == 422


def test_missing_profile_set_is_404(client: TestClient) -> None:
    assert client.get("/v1/profiles/sets/12345").status_code == 404


LINKS = [{"scope": "intra_node", "gpu_type": "A100", "bandwidth_gb_per_s": 230, "latency_us": 5},
         {"scope": "inter_node", "bandwidth_gb_per_s": 25, "latency_us": 10}]


def test_links_are_uploaded_and_replaced_in_a_new_version(client: TestClient) -> None:
    first = client.post("/v1/links", json={"links": LINKS})
    assert first.status_code == 201 and first.json()["version"] == 1
    second = client.post("/v1/links", json={"links": [
        {"scope": "inter_node", "bandwidth_gb_per_s": 50, "latency_us": 8},
        {"scope": "inter_zone", "zones": ["east", "west"], "bandwidth_gb_per_s": 2,
         "latency_us": 5000}]}).json()
    assert (second["version"], second["count"], second["replaced"]) == (2, 3, 1)
    newest = client.get("/v1/links").json()
    inter = [x for x in newest["links"] if x["scope"] == "inter_node"]
    assert [(x["bandwidth_gb_per_s"], x["uploaded"]) for x in inter] == [(50, True)]
    old = client.get("/v1/links?version=1").json()
    assert [x["bandwidth_gb_per_s"] for x in old["links"] if x["scope"] == "inter_node"] == [25]


def test_links_idempotency_key_replays(client: TestClient) -> None:
    headers = {"Idempotency-Key": "links-1"}
    first = client.post("/v1/links", json={"links": LINKS}, headers=headers).json()
    again = client.post("/v1/links", json={"links": LINKS}, headers=headers).json()
    assert again == first
    assert client.get("/v1/links").json()["version"] == 1


def test_intra_node_link_without_gpu_type_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/links", json={"links": [
        {"scope": "intra_node", "bandwidth_gb_per_s": 1, "latency_us": 1}]})
    assert response.status_code == 422
    assert "needs gpu_type" in response.json()["message"]


def test_inter_zone_link_between_one_zone_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/links", json={"links": [
        {"scope": "inter_zone", "zones": ["a", "a"], "bandwidth_gb_per_s": 1,
         "latency_us": 1}]})
    assert response.status_code == 422


def test_link_with_zero_bandwidth_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/links", json={"links": [
        {"scope": "inter_node", "bandwidth_gb_per_s": 0, "latency_us": 1}]})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "links[0].bandwidth_gb_per_s"


def test_link_with_negative_latency_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/links", json={"links": [
        {"scope": "inter_node", "bandwidth_gb_per_s": 1, "latency_us": -5}]})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "links[0].latency_us"


def test_link_with_unknown_scope_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/links", json={"links": [
        {"scope": "interplanetary", "bandwidth_gb_per_s": 1, "latency_us": 5}]})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "links[0].scope"


def test_duplicate_links_in_one_upload_are_rejected(client: TestClient) -> None:
    response = client.post("/v1/links", json={"links": [LINKS[1], LINKS[1]]})
    assert response.status_code == 422


def test_links_when_none_are_stored_is_404(client: TestClient) -> None:
    assert client.get("/v1/links").status_code == 404
