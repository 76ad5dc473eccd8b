"""Plans: inline solves and jobs (progress, cancel), stored plans with their sources,
evaluation, export, and the error paths of plan requests."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import planner
from planner.documents import Schedule
from planner.search import PlanResult
from tests.api.conftest import MakeClient, fixed_solver, register_catalogue


def wait_job(client: TestClient, job_id: str, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end in {timeout_s} s")


def test_plan_for_stored_cluster_is_solved_by_the_planner_and_stored(
        client: TestClient, scenario: dict[str, Any]) -> None:
    register_catalogue(client, scenario)
    request = {"cluster": "lab", "model": scenario["model"]["name"], "job": scenario["job"],
               "options": {"time_limit_s": 2}}
    response = client.post("/v1/plans", json=request)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["status"] in ("optimal", "feasible", "heuristic")
    assert body["evaluation"]["valid"] is True
    # the stored plan, re-evaluated from scratch, gives the numbers the answer carries
    again = planner.evaluate(planner.parse_scenario(scenario), planner.parse_plan(body["plan"]))
    assert again.iteration_s == pytest.approx(body["evaluation"]["iteration_s"], rel=1e-9)
    assert client.get(response.headers["location"]).json() == body
    assert body["sources"]["profiles"] == {"A100-80G": {"id": 1, "version": 1},
                                           "V100-32G": {"id": 2, "version": 1}}
    assert body["sources"]["cluster"] == {"name": "lab", "version": 1}
    assert body["options"] == {"time_limit_s": 2, "exact": False}


def test_plan_for_a_whole_scenario_document(client: TestClient,
                                            scenario: dict[str, Any]) -> None:
    response = client.post("/v1/plans", json={"scenario": scenario,
                                              "options": {"time_limit_s": 2}})
    assert response.status_code == 201, response.text
    assert response.json()["sources"] == {"scenario": "inline"}
    stored = client.get(f"/v1/plans/{response.json()['id']}/scenario").json()
    assert stored["model"]["layers"] == scenario["model"]["layers"]


def test_plan_records_pinned_profile_versions(make_client: MakeClient,
                                              scenario: dict[str, Any],
                                              plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    register_catalogue(client, scenario)
    register_catalogue_profiles_again = scenario["profiles"][:1]
    client.post("/v1/profiles", json={"model": scenario["model"]["name"],
                                      "gpu_type": "A100-80G",
                                      "rows": [{k: v for k, v in r.items() if k != "gpu_type"}
                                               for r in register_catalogue_profiles_again]})
    base = {"cluster": {"name": "lab"}, "model": scenario["model"]["name"],
            "job": scenario["job"], "options": {"time_limit_s": 1}}
    newest = client.post("/v1/plans", json=base).json()
    assert newest["sources"]["profiles"]["A100-80G"]["version"] == 2
    pinned = client.post("/v1/plans", json={**base, "profile_versions": {"A100-80G": 1}}).json()
    assert pinned["sources"]["profiles"]["A100-80G"] == {"id": 1, "version": 1}


def test_plans_from_stored_pieces_use_every_newer_upload_of_any_server(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    """The points of a profile version and the links of a link version are cached per
    process (a version never changes); what is newest must still be read each time, here
    after uploads through another server (its own cache) on the same database."""
    planning = make_client(solver=fixed_solver(plan_document))
    uploading = make_client(solver=fixed_solver(plan_document))
    register_catalogue(uploading, scenario)
    base = {"cluster": "lab", "model": scenario["model"]["name"], "job": scenario["job"]}

    def assembled(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        answer = planning.post("/v1/plans", json=body)
        assert answer.status_code == 201, answer.text
        plan_id = answer.json()["id"]
        return answer.json()["sources"], planning.get(f"/v1/plans/{plan_id}/scenario").json()

    def a100(document: dict[str, Any]) -> tuple[list[float], float]:
        return ([r["forward_ms"] for r in document["profiles"] if r["gpu_type"] == "A100-80G"],
                document["cluster"]["intra_node"]["A100-80G"]["bandwidth_gb_per_s"])

    _, first = assembled(base)
    rows = [{**{k: v for k, v in r.items() if k != "gpu_type"}, "forward_ms": 2 * r["forward_ms"]}
            for r in scenario["profiles"] if r["gpu_type"] == "A100-80G"]
    assert uploading.post("/v1/profiles", json={"model": scenario["model"]["name"],
                                                "gpu_type": "A100-80G", "rows": rows}
                          ).status_code == 201
    link = {"scope": "intra_node", "gpu_type": "A100-80G", "bandwidth_gb_per_s": 123.0,
            "latency_us": 4.0}
    assert uploading.post("/v1/links", json={"links": [link]}).status_code == 201
    sources, second = assembled(base)
    assert (sources["profiles"]["A100-80G"]["version"], sources["links"]) == (2, {"version": 2})
    assert a100(second) == ([2 * f for f in a100(first)[0]], 123.0)
    _, pinned = assembled({**base, "profile_versions": {"A100-80G": 1}, "links_version": 1})
    assert a100(pinned) == a100(first)


def test_long_plan_becomes_a_job_with_progress_and_a_stored_plan(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document, progress_steps=3),
                         sync_solve_threshold_s=1)
    response = client.post("/v1/plans", json={"scenario": scenario,
                                              "options": {"time_limit_s": 30}})
    assert response.status_code == 202
    assert response.headers["location"] == f"/v1/jobs/{response.json()['id']}"
    job = wait_job(client, response.json()["id"])
    assert (job["status"], job["progress"]) == ("succeeded", 1.0)
    plan = client.get(f"/v1/plans/{job['plan_id']}").json()
    assert plan["plan"]["pipelines"] == plan_document["pipelines"]


def test_plan_of_a_model_whose_untimed_steps_outlast_the_threshold_becomes_a_job(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    """Templates and baselines run whatever the time limit, and grow with layers squared:
    a 700-layer model's search takes seconds beyond its 1 s limit, too long to hold the
    request open for, though the limit alone is inline."""
    client = make_client(solver=fixed_solver(plan_document), sync_solve_threshold_s=5)
    layers = scenario["model"]["layers"]
    deep = dict(scenario, model=dict(scenario["model"],
                                     layers=[layers[0]] + [layers[1]] * 698 + [layers[-1]]))
    response = client.post("/v1/plans", json={"scenario": deep, "options": {"time_limit_s": 1}})
    assert response.status_code == 202, response.text
    assert response.headers["location"] == f"/v1/jobs/{response.json()['id']}"
    wait_job(client, response.json()["id"])
    shallow = client.post("/v1/plans", json={"scenario": scenario,
                                             "options": {"time_limit_s": 1}})
    assert shallow.status_code == 201, shallow.text


def test_job_query_forces_a_job(make_client: MakeClient, scenario: dict[str, Any],
                                plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    response = client.post("/v1/plans?job=true", json={"scenario": scenario})
    assert response.status_code == 202
    assert wait_job(client, response.json()["id"])["status"] == "succeeded"


def blocking_solver(started: threading.Event, release: threading.Event) -> Any:
    """Reports progress until released (cancel must stop it through progress)."""

    def solve(scenario: planner.Scenario, options: planner.SearchOptions,
              progress: Any) -> PlanResult:
        started.set()
        while not release.wait(0.01):
            progress(0.5, "searching")
        raise AssertionError("released without being cancelled")

    return solve


@contextlib.contextmanager
def running_job(
    make_client: MakeClient, scenario: dict[str, Any]
) -> Iterator[tuple[TestClient, dict[str, Any]]]:
    """A client and its plan job, whose search runs (blocked) until the block ends."""
    started, release = threading.Event(), threading.Event()
    client = make_client(solver=blocking_solver(started, release))
    try:
        job = client.post("/v1/plans?job=true", json={"scenario": scenario}).json()
        assert started.wait(10)
        yield client, job
    finally:
        release.set()


def test_running_job_is_cancelled(make_client: MakeClient, scenario: dict[str, Any]) -> None:
    with running_job(make_client, scenario) as (client, job):
        cancel = client.post(f"/v1/jobs/{job['id']}/cancel")
        assert cancel.status_code == 202
        assert cancel.json()["cancel_requested"] is True
        final = wait_job(client, job["id"])
        assert final["status"] == "cancelled" and final["plan_id"] is None
        assert client.get("/v1/plans").json()["count"] == 0


def test_queued_job_is_cancelled_before_it_starts(make_client: MakeClient,
                                                  scenario: dict[str, Any]) -> None:
    started, release = threading.Event(), threading.Event()
    client = make_client(solver=blocking_solver(started, release), solver_workers=1)
    try:
        first = client.post("/v1/plans?job=true", json={"scenario": scenario}).json()
        second = client.post("/v1/plans?job=true", json={"scenario": scenario}).json()
        assert started.wait(10)
        cancelled = client.post(f"/v1/jobs/{second['id']}/cancel").json()
        assert cancelled["status"] == "cancelled"
        client.post(f"/v1/jobs/{first['id']}/cancel")
        assert wait_job(client, first["id"])["status"] == "cancelled"
    finally:
        release.set()


def test_job_that_fails_reports_the_planner_error(make_client: MakeClient,
                                                  scenario: dict[str, Any]) -> None:
    def infeasible(*_: Any) -> PlanResult:
        raise planner.Infeasible("no stage fits: the smallest needs 95.0 GiB, the largest "
                                 "GPU has 80.0 GiB")

    client = make_client(solver=infeasible)
    job = client.post("/v1/plans?job=true", json={"scenario": scenario}).json()
    final = wait_job(client, job["id"])
    assert final["status"] == "failed"
    assert final["error"]["error"] == "infeasible" and "95.0 GiB" in final["error"]["message"]


def test_too_many_pending_jobs_is_503_with_retry_after(make_client: MakeClient,
                                      scenario: dict[str, Any]) -> None:
    started, release = threading.Event(), threading.Event()
    client = make_client(solver=blocking_solver(started, release), max_pending_jobs=1)
    try:
        first = client.post("/v1/plans?job=true", json={"scenario": scenario}).json()
        response = client.post("/v1/plans?job=true", json={"scenario": scenario})
        assert response.status_code == 503
        assert response.json()["error"] == "overloaded"
        assert response.headers["retry-after"] == "1"
        client.post(f"/v1/jobs/{first['id']}/cancel")
        wait_job(client, first["id"])
    finally:
        release.set()


def test_cancelling_a_finished_job_is_409_and_changes_nothing(make_client: MakeClient,
                                                              scenario: dict[str, Any],
                                                              plan_document: dict[str, Any]
                                                              ) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    job = client.post("/v1/plans?job=true", json={"scenario": scenario}).json()
    done = wait_job(client, job["id"])
    refused = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert refused.status_code == 409
    assert refused.json()["error"] == "conflict" and "already ended" in refused.json()["message"]
    assert refused.json()["problems"] == [{"path": "status", "value": "succeeded",
                                           "message": "the job has ended; nothing to cancel"}]
    assert client.get(f"/v1/jobs/{job['id']}").json() == done


def test_infeasible_scenario_is_422_with_the_numbers(client: TestClient,
                                                     scenario: dict[str, Any]) -> None:
    for gpu in scenario["gpu_types"].values():
        gpu["memory_gib"] = 1.0  # less than the 2 GiB reserved: no stage fits anywhere
    response = client.post("/v1/plans", json={"scenario": scenario,
                                              "options": {"time_limit_s": 2}})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "infeasible"
    assert "GiB" in body["message"] and any(ch.isdigit() for ch in body["message"])


def test_requested_time_limit_is_capped_by_the_server(make_client: MakeClient,
                                                      scenario: dict[str, Any],
                                                      plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document), max_time_limit_s=3,
                         sync_solve_threshold_s=5)
    response = client.post("/v1/plans", json={"scenario": scenario,
                                              "options": {"time_limit_s": 3600}})
    assert response.status_code == 201
    assert response.json()["options"]["time_limit_s"] == 3


def test_plan_request_with_invalid_scenario_lists_the_problems(
        client: TestClient, scenario: dict[str, Any]) -> None:
    scenario["cluster"]["nodes"][0]["gpu_type"] = "H900"
    response = client.post("/v1/plans", json={"scenario": scenario})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "invalid_scenario"
    assert {p["path"] for p in body["problems"]} >= {"cluster.nodes[0].gpu_type"}


def test_plan_request_with_nan_in_scenario_is_rejected(client: TestClient,
                                                       scenario: dict[str, Any]) -> None:
    import json

    scenario["profiles"][0]["forward_ms"] = float("nan")
    response = client.post("/v1/plans", content=json.dumps({"scenario": scenario}).encode(),
                           headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "scenario.profiles[0].forward_ms"


def test_plan_request_naming_an_unknown_cluster_is_rejected(
        client: TestClient, scenario: dict[str, Any]) -> None:
    register_catalogue(client, scenario)
    response = client.post("/v1/plans", json={"cluster": "nowhere", "model": "gpt-1.3b",
                                              "job": {"global_batch_size": 8}})
    assert response.status_code == 422
    assert "POST /v1/clusters" in response.json()["message"]


def test_plan_request_without_scenario_or_pieces_is_rejected(client: TestClient) -> None:
    response = client.post("/v1/plans", json={"options": {"time_limit_s": 1}})
    assert response.status_code == 422
    assert {p["path"] for p in response.json()["problems"]} == {"cluster", "model", "job"}


def test_plan_request_with_both_scenario_and_cluster_is_rejected(
        client: TestClient, scenario: dict[str, Any]) -> None:
    response = client.post("/v1/plans", json={"scenario": scenario, "cluster": "lab"})
    assert response.status_code == 422
    assert "not both" in response.json()["message"]


def test_plan_request_without_stored_links_is_rejected(client: TestClient,
                                                       scenario: dict[str, Any]) -> None:
    for name, gpu in scenario["gpu_types"].items():
        client.post("/v1/gpu-types", json={"name": name, "memory_gib": gpu["memory_gib"]})
    client.post("/v1/models", json=scenario["model"])
    client.post("/v1/clusters", json={"name": "lab", "nodes": scenario["cluster"]["nodes"]})
    response = client.post("/v1/plans", json={"cluster": "lab", "model": "gpt-1.3b",
                                              "job": scenario["job"]})
    assert response.status_code == 422
    assert "POST /v1/links" in response.json()["message"]


def test_plan_request_without_profiles_is_rejected(client: TestClient,
                                                   scenario: dict[str, Any]) -> None:
    register_catalogue(client, scenario)
    response = client.post("/v1/plans", json={"cluster": "lab", "model": "gpt-1.3b",
                                              "job": scenario["job"],
                                              "profile_versions": {"A100-80G": 7}})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "profile_versions.A100-80G"


def test_plan_request_with_negative_time_limit_is_rejected(client: TestClient,
                                                           scenario: dict[str, Any]) -> None:
    response = client.post("/v1/plans", json={"scenario": scenario,
                                              "options": {"time_limit_s": -1}})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "options.time_limit_s"


def test_missing_plan_is_404(client: TestClient) -> None:
    response = client.get("/v1/plans/0123abcd")
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_a_plan_id_that_is_not_hexadecimal_is_404_as_any_unknown_id(client: TestClient) -> None:
    response = client.get("/v1/plans/not-hex")
    assert response.status_code == 404, response.text
    assert response.json()["problems"][0]["path"] == "/v1/plans/not-hex"


def test_missing_job_is_404(client: TestClient) -> None:
    assert client.get("/v1/jobs/0123abcd").status_code == 404
    assert client.post("/v1/jobs/0123abcd/cancel").status_code == 404


def test_plans_are_listed_with_their_numbers(make_client: MakeClient,
                                             scenario: dict[str, Any],
                                             plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    ids = [client.post("/v1/plans", json={"scenario": scenario}).json()["id"]
           for _ in range(2)]
    listed = client.get("/v1/plans").json()
    assert listed["count"] == 2 and {p["id"] for p in listed["data"]} == set(ids)
    expected = planner.evaluate(planner.parse_scenario(scenario),
                                planner.parse_plan(plan_document)).iteration_s
    assert listed["data"][0]["iteration_s"] == pytest.approx(expected)


def test_evaluate_gives_the_cost_model_numbers(client: TestClient, scenario: dict[str, Any],
                                               plan_document: dict[str, Any]) -> None:
    response = client.post("/v1/evaluate", json={"scenario": scenario, "plan": plan_document})
    assert response.status_code == 200
    expected = planner.evaluate(planner.parse_scenario(scenario),
                                planner.parse_plan(plan_document))
    assert response.json()["valid"] is True
    assert response.json()["iteration_s"] == pytest.approx(expected.iteration_s, rel=1e-12)


def test_evaluate_on_stored_pieces(client: TestClient, scenario: dict[str, Any],
                                   plan_document: dict[str, Any]) -> None:
    register_catalogue(client, scenario)
    response = client.post("/v1/evaluate", json={"cluster": "lab", "model": "gpt-1.3b",
                                                 "job": scenario["job"], "plan": plan_document})
    assert response.status_code == 200 and response.json()["valid"] is True


def test_evaluate_of_an_invalid_plan_answers_valid_false(
        client: TestClient, scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    plan_document["pipelines"][0]["num_micro_batches"] += 1  # batch no longer adds up
    response = client.post("/v1/evaluate", json={"scenario": scenario, "plan": plan_document})
    assert response.status_code == 200
    assert response.json()["valid"] is False and response.json()["errors"]


def test_evaluate_of_a_malformed_plan_is_422(client: TestClient,
                                             scenario: dict[str, Any]) -> None:
    response = client.post("/v1/evaluate", json={"scenario": scenario,
                                                 "plan": {"format": "hetplan-plan/1"}})
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_plan"


def test_rankmap_and_export_of_a_stored_plan(make_client: MakeClient,
                                             scenario: dict[str, Any],
                                             plan_document: dict[str, Any]) -> None:
    pytest.importorskip("planner.export", reason="planner.export is not in this tree yet")
    client = make_client(solver=fixed_solver(plan_document))
    plan_id = client.post("/v1/plans", json={"scenario": scenario}).json()["id"]
    from planner.export import export_plan, rank_map

    plan = planner.parse_plan(plan_document)
    assert client.get(f"/v1/plans/{plan_id}/rankmap").json() == _jsonable(rank_map(plan))
    response = client.get(f"/v1/plans/{plan_id}/export?format=torchrun")
    assert response.status_code in (200, 422)
    if response.status_code == 200:
        assert response.json() == _jsonable(export_plan(plan, "torchrun"))
    else:
        assert response.json()["error"] == "unsupported_export"


def test_export_in_an_unknown_format_is_rejected(client: TestClient) -> None:
    response = client.get("/v1/plans/0123abcd/export?format=mpirun")
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"] == "query.format"


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value))


def test_plan_for_inline_cluster_and_model_with_stored_profiles(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    register_catalogue(client, scenario)
    cluster = {"name": "adhoc", "nodes": scenario["cluster"]["nodes"],
               "intra_node": scenario["cluster"]["intra_node"],
               "inter_node": {"bandwidth_gb_per_s": 50, "latency_us": 10}}
    response = client.post("/v1/plans", json={
        "cluster": cluster, "model": scenario["model"], "job": scenario["job"],
        "gpu_types": {"A100-80G": {"name": "A100-80G", "memory_gib": 40}},
        "options": {"time_limit_s": 1}})
    assert response.status_code == 201, response.text
    sources = response.json()["sources"]
    assert (sources["cluster"], sources["model"], sources["links"]) == (
        "inline", "inline", "cluster")
    assert sources["gpu_types"] == {"A100-80G": "inline", "V100-32G": {"version": 1}}
    used = client.get(f"/v1/plans/{response.json()['id']}/scenario").json()
    assert used["cluster"]["inter_node"]["bandwidth_gb_per_s"] == 50
    assert used["gpu_types"]["A100-80G"]["memory_gib"] == 40


def test_app_takes_jobs_again_after_its_lifespan_restarts(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    client.__exit__(None, None, None)  # lifespan ends: the job threads stop
    with TestClient(client.app) as again:
        job = again.post("/v1/plans?job=true", json={"scenario": scenario}).json()
        assert wait_job(again, job["id"])["status"] == "succeeded"
    client.__enter__()  # the fixture exits it once more


def test_plan_answers_carry_the_price_of_the_gpus_used(make_client: MakeClient,
                                                      scenario: dict[str, Any],
                                                      plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    body = client.post("/v1/plans", json={"scenario": scenario}).json()
    parsed = planner.parse_scenario(scenario)
    used = [gpu for p in plan_document["pipelines"] for s in p["stages"] for gpu in s["gpus"]]
    types = {n.name: n.gpu_type for n in parsed.cluster.nodes}
    price = sum(parsed.gpu_types[types[g.rpartition(":")[0]]].hourly_usd or 0 for g in used)
    assert body["evaluation"]["usd_per_hour"] == pytest.approx(price)
    assert body["plan"]["estimate"]["usd_per_hour"] == pytest.approx(price)
    assert body["plan"]["estimate"]["usd_per_million_tokens"] == \
        body["evaluation"]["usd_per_million_tokens"]
    assert client.get("/v1/plans").json()["data"][0]["usd_per_hour"] == pytest.approx(price)


@pytest.mark.parametrize("variant", ["interleaved.random2", "local.random1"])
def test_evaluate_over_http_gives_the_section_6_and_7_numbers(
        client: TestClient, variant: str) -> None:
    reference = Path(__file__).parent.parent / "data" / "reference"
    name = "a80x16-v32x16-gpt1.3b"
    scenario = json.loads((reference / f"{name}.{variant.split('.')[0]}.json").read_text())
    plan = json.loads((reference / f"{name}.{variant}.plan.json").read_text())
    expected = json.loads((reference / f"{name}.{variant}.expected.json").read_text())
    body = client.post("/v1/evaluate", json={"scenario": scenario, "plan": plan}).json()
    assert (body["valid"], body["schedule"]) == (expected["valid"], expected["schedule"])
    for key in ("iteration_s", "usd_per_hour", "usd_per_million_tokens", "usd_per_iteration"):
        assert body[key] == pytest.approx(expected[key], rel=1e-9), key
    assert body["pipelines"][0]["stages"][0]["memory_bytes"] == \
        pytest.approx(expected["pipelines"][0]["stages"][0]["memory_bytes"], rel=1e-9)


def test_evaluate_on_stored_pieces_with_a_local_job(client: TestClient,
                                                    scenario: dict[str, Any]) -> None:
    reference = Path(__file__).parent.parent / "data" / "reference"
    local = json.loads((reference / "a80x16-v32x16-gpt1.3b.local.json").read_text())
    register_catalogue(client, local)
    plan = json.loads((reference / "a80x16-v32x16-gpt1.3b.local.random0.plan.json").read_text())
    response = client.post("/v1/evaluate", json={"cluster": "lab", "model": local["model"]["name"],
                                                 "job": local["job"], "plan": plan})
    assert response.status_code == 200, response.text
    assert response.json()["valid"] is True and response.json()["schedule"] == "local"


def test_job_finishes_through_a_database_blip_on_its_status_writes(
        make_client: MakeClient, scenario: dict[str, Any], plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document))
    failures = [3]

    def blip(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        on_job_thread = threading.current_thread().name.startswith("hetplan-job")
        if on_job_thread and statement.lstrip().upper().startswith("UPDATE JOBS") \
                and failures[0] > 0:
            failures[0] -= 1
            raise sa.exc.OperationalError(statement, {}, Exception("connection lost"))

    sa.event.listen(client.app.state.store.engine,  # type: ignore[attr-defined]
                    "before_cursor_execute", blip)
    job = client.post("/v1/plans?job=true", json={"scenario": scenario}).json()
    assert wait_job(client, job["id"], timeout_s=15)["status"] == "succeeded"
    assert failures == [0]


def test_plan_request_passes_its_schedule_options_to_the_search(
        make_client: MakeClient, scenario: dict[str, Any]) -> None:
    seen: list[planner.SearchOptions] = []

    def solve(scenario_doc: planner.Scenario, options: planner.SearchOptions,
              progress: Any) -> PlanResult:
        seen.append(options)
        return planner.plan(scenario_doc, dataclasses.replace(options, time_limit_s=1))

    client = make_client(solver=solve)
    response = client.post("/v1/plans", json={"scenario": scenario, "options": {
        "time_limit_s": 1, "schedules": ["1f1b", "interleaved-1f1b"], "recompute": True}})
    assert response.status_code == 201, response.text
    assert seen[0].schedules == (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B)
    assert seen[0].recompute is True and seen[0].max_local_blocks is None
    assert response.json()["options"] == {"time_limit_s": 1, "exact": False,
                                          "schedules": ["1f1b", "interleaved-1f1b"],
                                          "recompute": True}
    assert response.json()["evaluation"]["valid"] is True


def test_plan_request_allowing_local_for_a_job_that_is_not_local_is_422(
        client: TestClient, scenario: dict[str, Any]) -> None:
    response = client.post("/v1/plans", json={"scenario": scenario, "options": {
        "time_limit_s": 1, "schedules": ["local"]}})
    assert response.status_code == 422, response.text
    assert "only a job whose schedule is 'local'" in response.json()["message"]


def test_plan_request_with_an_unknown_schedule_is_rejected(client: TestClient,
                                                           scenario: dict[str, Any]) -> None:
    response = client.post("/v1/plans", json={"scenario": scenario, "options": {
        "time_limit_s": 1, "schedules": ["zero-bubble"]}})
    assert response.status_code == 422
    assert response.json()["problems"][0]["path"].startswith("options.schedules")


def test_plan_request_for_a_launcher_answers_a_plan_it_runs(client: TestClient) -> None:
    from planner.export import expressible

    document = json.loads((Path(__file__).parent.parent / "data" / "scenarios"
                           / "l40sx16-a40x8-v32x16-t4x8-gpt2.7b.json").read_text())
    response = client.post("/v1/plans", json={"scenario": document, "options": {
        "time_limit_s": 3, "launcher": "megatron"}})
    assert response.status_code == 201, response.text
    plan = planner.parse_plan(response.json()["plan"])
    assert expressible(plan, "megatron") is None
    assert client.post("/v1/plans", json={"scenario": document, "options": {
        "launcher": "ray-train"}}).status_code == 422
