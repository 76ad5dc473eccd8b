"""Bodies are checked whole before anything is stored: free-form JSON holds only finite
numbers and valid Unicode, and authorization comes before the body is decoded."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from api.routing import first_unstorable_value
from tests.api.conftest import MakeClient

JSON = {"content-type": "application/json"}
ROWS = (b'"rows": [{"kind": "b", "micro_batch": 1, "tp": 1, "forward_ms": 1, '
        b'"backward_ms": 1, "activation_bytes": 1}]')


def upload_with_source(client: TestClient, source: bytes) -> object:
    body = b'{"model": "m", "gpu_type": "g", ' + ROWS + b', "source": ' + source + b"}"
    return client.post("/v1/profiles", content=body, headers=JSON)


@pytest.mark.parametrize("source", [b'{"host": "\\udfff"}', b'{"\\ud800": 1}',
                                    b'{"nested": [{"x": "ok \\udc00"}]}'])
def test_upload_profile_with_lone_surrogate_in_source_is_rejected_and_stores_nothing(
        client: TestClient, source: bytes) -> None:
    response = upload_with_source(client, source)
    assert response.status_code == 422, response.text
    assert "Unicode" in response.json()["message"]
    listed = client.get("/v1/profiles/sets")
    assert listed.status_code == 200
    assert listed.json()["count"] == 0


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999",
                                    b"1" * 400 + b".5"])
def test_upload_profile_with_non_finite_number_in_source_is_rejected(
        client: TestClient, number: bytes) -> None:
    response = upload_with_source(client, b'{"clock": [1, ' + number + b"]}")
    assert response.status_code == 422, response.text
    assert response.json()["problems"][0]["path"] == "source.clock[1]"
    assert client.get("/v1/profiles/sets").json()["count"] == 0


def test_surrogate_pair_escape_is_valid_unicode_and_round_trips(client: TestClient) -> None:
    response = upload_with_source(client, b'{"note": "\\ud83d\\ude00", "n": 1e300}')
    assert response.status_code == 201, response.text
    stored = client.get(response.headers["location"]).json()
    assert stored["source"] == {"note": "\U0001f600", "n": 1e300}


def test_gpu_type_name_with_lone_surrogate_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/gpu-types", content=b'{"name": "A\\udfff", "memory_gib": 80}',
                           headers=JSON)
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "name"
    assert client.get("/v1/gpu-types").json()["count"] == 0


def test_upload_without_token_is_refused_before_its_body_is_decoded(
        make_client: MakeClient) -> None:
    secured = make_client(tokens={"up": ["upload"]})
    response = secured.post("/v1/gpu-types", content=b'{"name": ', headers=JSON)
    assert response.status_code == 401  # not 422: the broken body was never read


def test_upload_with_a_read_only_scope_is_refused_before_its_body_is_decoded(
        make_client: MakeClient) -> None:
    secured = make_client(tokens={"pl": ["plan"]})
    response = secured.post("/v1/gpu-types", content=b"[" * 10_000,
                            headers={**JSON, "Authorization": "Bearer pl"})
    assert response.status_code == 403


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(), lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@given(_plain)
def test_plain_json_has_no_unstorable_value(document: object) -> None:
    assert first_unstorable_value(document) is None


@given(_plain, st.sampled_from([math.nan, math.inf, "\udfff"]))
def test_an_unstorable_value_is_found_wherever_it_is(document: object, bad: object) -> None:
    found = first_unstorable_value({"a": [document, {"b": bad}]})
    assert found is not None
    assert found[0] == ("a", 1, "b")


@pytest.mark.parametrize("field, value", [("memory_gib", False), ("memory_gib", "80"),
                                          ("reserved_gib", True)])
def test_gpu_type_with_a_number_given_as_another_type_is_rejected(
        client: TestClient, field: str, value: object) -> None:
    response = client.post("/v1/gpu-types", json={"name": "A100", "memory_gib": 80,
                                                  field: value})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == field
