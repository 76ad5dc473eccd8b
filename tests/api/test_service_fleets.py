"""Money over HTTP: the frontier, what-if fleets and plan objectives, every plan stored."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import MakeClient
from tests.api.test_service_plans import wait_job
from tests.planner.fleet_scenarios import priced

BOTH = 4 / 0.0094  # both GPUs of the priced scenario (see tests/planner/test_fleet.py)


def test_frontier_points_are_stored_plans_cheapest_first(client: TestClient) -> None:
    response = client.post("/v1/plans/pareto", json={"scenario": priced(),
                                                     "options": {"time_limit_s": 1}})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["fleets_planned"] == 3
    assert [p["usd_per_hour"] for p in body["frontier"]] == [1.0, 4.0, 5.0]
    for point in body["frontier"]:
        stored = client.get(f"/v1/plans/{point['plan_id']}").json()
        assert stored["evaluation"]["valid"] is True
        assert stored["evaluation"]["samples_per_s"] == pytest.approx(point["samples_per_s"])
        assert stored["plan"]["search"]["fleet"] == point["fleet"]


def test_frontier_of_unpriced_gpus_is_refused_naming_the_type(client: TestClient) -> None:
    document = priced()
    del document["gpu_types"]["F"]["hourly_usd"]
    response = client.post("/v1/plans/pareto", json={"scenario": document})
    assert response.status_code == 422
    assert "gpu_types.F.hourly_usd" in response.text


def test_frontier_longer_than_the_inline_limit_is_a_job_whose_result_is_the_answer(
        make_client: MakeClient) -> None:
    client = make_client(max_time_limit_s=2.0)
    response = client.post("/v1/plans/pareto", json={
        "scenario": priced(), "options": {"time_limit_s": 1, "max_fleets": 3}})
    assert response.status_code == 202, response.text
    assert response.json()["kind"] == "pareto"
    job = wait_job(client, response.json()["id"])
    assert (job["status"], job["progress"], job["plan_id"]) == ("succeeded", 1.0, None)
    frontier = job["result"]["frontier"]
    assert [p["usd_per_hour"] for p in frontier] == [1.0, 4.0, 5.0]
    for point in frontier:  # every point is a stored plan
        stored = client.get(f"/v1/plans/{point['plan_id']}").json()
        assert stored["plan"]["search"]["fleet"] == point["fleet"]


def test_frontier_job_of_unpriced_gpus_is_refused_before_it_is_queued(
        client: TestClient) -> None:
    document = priced()
    del document["gpu_types"]["F"]["hourly_usd"]
    response = client.post("/v1/plans/pareto?job=true", json={"scenario": document})
    assert response.status_code == 422
    assert "gpu_types.F.hourly_usd" in response.text


def test_what_if_as_a_job_answers_its_rows_in_the_result(client: TestClient) -> None:
    response = client.post("/v1/whatif?job=true", json={
        "scenario": priced(), "options": {"time_limit_s": 1},
        "variants": [{"remove_types": ["F"]}]})
    assert response.status_code == 202, response.text
    assert response.headers["location"] == f"/v1/jobs/{response.json()['id']}"
    job = wait_job(client, response.json()["id"])
    assert job["status"] == "succeeded" and job["kind"] == "whatif", job
    base, s_only = job["result"]["rows"]
    assert s_only["usd_per_hour"] == 1.0 and s_only["usd_per_hour_change"] == pytest.approx(-0.8)
    stored = client.get(f"/v1/plans/{s_only['plan_id']}/scenario").json()
    assert [n["gpu_type"] for n in stored["cluster"]["nodes"]] == ["S"]


def test_what_if_job_with_an_unknown_gpu_type_is_a_422(client: TestClient) -> None:
    response = client.post("/v1/whatif?job=true", json={
        "scenario": priced(), "variants": [{"add": [{"gpu_type": "H9", "nodes": 1}]}]})
    assert response.status_code == 422
    assert "variants[0].add[0].gpu_type" in response.text


def test_what_if_rows_carry_changes_and_stored_plans_of_the_variant(client: TestClient) -> None:
    response = client.post("/v1/whatif", json={
        "scenario": priced(), "options": {"time_limit_s": 1},
        "variants": [{"remove_types": ["F"]}, {"name": "more S", "add": [{"gpu_type": "S",
                                                                          "nodes": 1}]}]})
    assert response.status_code == 201, response.text
    base, s_only, more = response.json()["rows"]
    assert base["name"] == "base" and base["samples_per_s_change"] is None
    assert s_only["usd_per_hour"] == 1.0 and s_only["usd_per_hour_change"] == pytest.approx(-0.8)
    stored = client.get(f"/v1/plans/{more['plan_id']}/scenario").json()
    assert [n["gpu_type"] for n in stored["cluster"]["nodes"]] == ["F", "S", "S"]


def test_what_if_with_an_unknown_gpu_type_is_a_422(client: TestClient) -> None:
    response = client.post("/v1/whatif", json={
        "scenario": priced(), "variants": [{"add": [{"gpu_type": "H9", "nodes": 1}]}]})
    assert response.status_code == 422
    assert "variants[0].add[0].gpu_type" in response.text


def test_plan_with_cost_objective_and_floor(client: TestClient) -> None:
    response = client.post("/v1/plans", json={"scenario": priced(), "options": {
        "time_limit_s": 1, "objective": "cost", "min_samples_per_s": 300}})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["evaluation"]["samples_per_s"] == pytest.approx(BOTH)
    assert body["options"]["objective"] == "cost"
    assert body["options"]["min_samples_per_s"] == 300


def test_plan_budget_no_plan_meets_names_the_closest_plan(client: TestClient) -> None:
    response = client.post("/v1/plans", json={"scenario": priced(), "options": {
        "time_limit_s": 1, "max_usd_per_hour": 0.5}})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "infeasible"
    assert "S 1/1 nodes, reaches 166.7 samples/s at $1/hour" in body["message"]


def test_plan_job_with_cost_objective_stores_the_cheapest_per_token_plan(
        client: TestClient) -> None:
    response = client.post("/v1/plans?job=true", json={"scenario": priced(), "options": {
        "time_limit_s": 1, "objective": "cost"}})
    assert response.status_code == 202, response.text
    job = wait_job(client, response.json()["id"])
    assert job["status"] == "succeeded", job
    stored = client.get(f"/v1/plans/{job['plan_id']}").json()
    assert stored["evaluation"]["usd_per_hour"] == 1.0
    assert stored["options"]["objective"] == "cost"


def test_plan_with_a_goal_longer_than_the_inline_threshold_becomes_a_job(
        make_client: MakeClient) -> None:
    # Three sub-fleets of 1 s each: 3 s of search, above a 2 s inline threshold.
    client = make_client(sync_solve_threshold_s=2.0)
    response = client.post("/v1/plans", json={"scenario": priced(), "options": {
        "time_limit_s": 1, "objective": "cost"}})
    assert response.status_code == 202, response.text
    assert wait_job(client, response.json()["id"])["status"] == "succeeded"


def test_frontier_goes_on_past_a_fleet_the_search_process_refuses(client: TestClient) -> None:
    document = priced()
    document["gpu_types"]["S"]["memory_gib"] = 1  # below the job's 2 GiB reserve: nothing fits
    response = client.post("/v1/plans/pareto", json={"scenario": document,
                                                     "options": {"time_limit_s": 1}})
    assert response.status_code == 201, response.text
    assert [p["usd_per_hour"] for p in response.json()["frontier"]] == [4.0]
