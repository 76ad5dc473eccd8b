"""Durable jobs: claimed by workers under a lease, taken over when a worker dies, retried a
bounded number of times, never run by two workers at once, cancelled across processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import planner
from api.job_requests import job_request
from api.jobs import exhausted_error
from api.services.planning import effective_options
from api.services.scenarios import Assembled
from api.settings import Settings
from api.storage import JobKind, Store, make_engine, migrate
from planner.search import PlanResult
from tests.api.conftest import MakeClient, fixed_solver
from tests.api.test_service_plans import blocking_solver, running_job, wait_job
from tests.planner.fleet_scenarios import priced

FAST = {"job_lease_s": 0.6, "job_poll_s": 0.05}
"""Short leases and polls, so that a lapsed lease is taken over within a second."""


def queue_job(store: Store, scenario: dict[str, Any], job_id: str) -> None:
    """A plan job queued as the API queues one, with no worker told about it."""
    assembled = Assembled(scenario=planner.parse_scenario(scenario), document=scenario,
                          sources={"scenario": "inline"})
    options = effective_options(1.0, False, Settings())
    store.add_job(job_id, kind=JobKind.PLAN, request=job_request(assembled, options))


def claim_as(store: Store, owner: str, lease_s: float) -> Any:
    return store.claim_job(owner=owner, lease_s=lease_s, max_attempts=3,
                           exhausted_error=exhausted_error)


def test_job_of_a_worker_that_died_is_claimed_again_after_its_lease_and_succeeds(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document), embedded_worker=False)
    store = client.app.state.store  # type: ignore[attr-defined]
    queue_job(store, scenario, "dead0001" * 4)
    assert claim_as(store, "a-worker-that-dies", lease_s=0.3).job.id == "dead0001" * 4
    make_client(solver=fixed_solver(plan_document), **FAST)  # a live worker starts
    job = wait_job(client, "dead0001" * 4)
    assert (job["status"], job["attempts"]) == ("succeeded", 2)
    assert client.get(f"/v1/plans/{job['plan_id']}").status_code == 200


def test_job_is_left_to_its_worker_while_the_lease_holds(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document), embedded_worker=False)
    store = client.app.state.store  # type: ignore[attr-defined]
    queue_job(store, scenario, "11fe0000" * 4)
    claimed = claim_as(store, "a-live-worker-elsewhere", lease_s=60)
    make_client(solver=fixed_solver(plan_document), **FAST)
    time.sleep(1.0)  # twenty polls of that worker
    job = store.get_job(claimed.job.id)
    assert (job.status.value, job.owner, job.attempts) == (
        "running", "a-live-worker-elsewhere", 1)


def test_job_fails_with_the_reason_once_its_attempts_are_exhausted(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    client = make_client(solver=fixed_solver(plan_document), embedded_worker=False)
    store = client.app.state.store  # type: ignore[attr-defined]
    queue_job(store, scenario, "0dd5" * 8)
    for attempt in range(3):  # three workers die in turn while running it
        claimed = claim_as(store, f"dies-{attempt}", lease_s=0.05)
        assert claimed.job.attempts == attempt + 1
        time.sleep(0.1)
    make_client(solver=fixed_solver(plan_document), max_job_attempts=3, **FAST)
    job = wait_job(client, "0dd5" * 8)
    assert (job["status"], job["attempts"], job["plan_id"]) == ("failed", 3, None)
    assert job["error"]["error"] == "job_attempts_exhausted"
    assert "started 3 times" in job["error"]["message"]


def test_two_claimers_never_take_the_same_job(database_url: str,
                                              scenario: dict[str, Any]) -> None:
    engine = make_engine(database_url)
    migrate(engine)
    queue = Store(engine)
    ids = [f"{i:032x}" for i in range(24)]
    for job_id in ids:
        queue_job(queue, scenario, job_id)
    claims: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(6)

    def claim_all(n: int) -> None:
        own = Store(make_engine(database_url))  # a connection pool per claimer
        go.wait()
        while (claimed := claim_as(own, f"claimer-{n}", lease_s=60)) is not None:
            with lock:
                claims.append(claimed.job.id)
        own.engine.dispose()

    threads = [threading.Thread(target=claim_all, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claims) == ids  # each job once, none twice
    assert {queue.get_job(i).attempts for i in ids} == {1}
    engine.dispose()


def counting_solver(plan_document: dict[str, Any], calls: Counter[str],
                    lock: threading.Lock) -> Any:
    """A fixed solver that counts the searches of each job (a job names its scenario)."""
    inner = fixed_solver(plan_document)

    def solve(scenario: planner.Scenario, options: planner.SearchOptions,
              progress: Any) -> PlanResult:
        with lock:
            calls[scenario.model.name] += 1
        time.sleep(0.05)
        return inner(scenario, options, progress)

    return solve


def test_two_workers_share_the_jobs_and_run_each_once(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    api = make_client(embedded_worker=False)
    # Leases long enough that a worker starved of CPU for a moment keeps its job: this test
    # is about sharing, not takeover (a 0.6 s lease lapsed once on a loaded 2-core VM).
    for _ in range(2):
        make_client(solver=counting_solver(plan_document, calls, lock), solver_workers=2,
                    **{**FAST, "job_lease_s": 5.0})
    names = [f"model-{i}" for i in range(10)]
    jobs = []
    for name in names:
        document = {**scenario, "model": {**scenario["model"], "name": name}}
        response = api.post("/v1/plans?job=true", json={"scenario": document})
        assert response.status_code == 202, response.text
        jobs.append(response.json()["id"])
    finished = [wait_job(api, job_id) for job_id in jobs]
    assert {(j["status"], j["attempts"]) for j in finished} == {("succeeded", 1)}
    assert calls == Counter(names)  # every job searched exactly once
    assert api.get("/v1/plans").json()["count"] == len(names)


def test_cancel_reaches_a_job_running_in_another_process(
        make_client: MakeClient, scenario: dict[str, Any]) -> None:
    started, release = threading.Event(), threading.Event()
    api = make_client(embedded_worker=False)
    make_client(solver=blocking_solver(started, release), **FAST)
    try:
        job = api.post("/v1/plans?job=true", json={"scenario": scenario}).json()
        assert started.wait(10)
        assert api.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
        assert wait_job(api, job["id"])["status"] == "cancelled"
    finally:
        release.set()


def test_cancel_stops_a_sweep_job_inside_a_fleets_search(make_client: MakeClient) -> None:
    started, release = threading.Event(), threading.Event()
    client = make_client(solver=blocking_solver(started, release))
    try:
        job = client.post("/v1/plans/pareto?job=true", json={
            "scenario": priced(), "options": {"time_limit_s": 1}}).json()
        assert started.wait(10)  # the first fleet's search runs
        client.post(f"/v1/jobs/{job['id']}/cancel")
        final = wait_job(client, job["id"])
        assert (final["status"], final["result"]) == ("cancelled", None)
        assert client.get("/v1/plans").json()["count"] == 0
    finally:
        release.set()


def test_worker_whose_job_was_taken_over_stops_its_search_and_writes_nothing(
        make_client: MakeClient, scenario: dict[str, Any]) -> None:
    import sqlalchemy as sa

    from api.storage import tables

    with running_job(make_client, scenario) as (client, job):
        store, worker = client.app.state.store, client.app.state.worker  # type: ignore[attr-defined]
        with store.engine.begin() as connection:  # as if its lease lapsed and another took it
            connection.execute(sa.update(tables.jobs).where(tables.jobs.c.id == job["id"])
                               .values(owner="another-worker"))
        deadline = time.monotonic() + 10
        while worker.running:
            assert time.monotonic() < deadline, "the search went on after the takeover"
            time.sleep(0.05)
        taken = store.get_job(job["id"])
        assert (taken.status.value, taken.owner) == ("running", "another-worker")


def test_a_worker_shutting_down_queues_its_job_for_the_next_one(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    with running_job(make_client, scenario) as (client, job):
        client.app.state.worker.stop()  # type: ignore[attr-defined]
        requeued = client.get(f"/v1/jobs/{job['id']}").json()
        assert (requeued["status"], requeued["attempts"]) == ("queued", 0)
        # The plan on the first copy of the nodes, its micro-batches covering the batch.
        make_client(solver=fixed_solver({**plan_document, "pipelines": [
            {**pipeline, "num_micro_batches": pipeline["num_micro_batches"] * COPIES}
            for pipeline in plan_document["pipelines"]]}), **FAST)
        done = wait_job(client, job["id"])
        assert (done["status"], done["attempts"]) == ("succeeded", 1)


def test_api_replica_without_a_worker_queues_jobs_for_workers(
        make_client: MakeClient, scenario: dict[str, Any],
        plan_document: dict[str, Any]) -> None:
    api = make_client(embedded_worker=False)
    job = api.post("/v1/plans?job=true", json={"scenario": scenario}).json()
    time.sleep(0.3)
    assert api.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"
    make_client(solver=fixed_solver(plan_document), **FAST)
    assert wait_job(api, job["id"])["status"] == "succeeded"


COPIES = 128
"""The scenario's nodes repeated this many times, the batch with them: a search of seconds
(about 1.9 s on a quiet 2-core VM, 4,096 GPUs), where the scenario itself plans in tenths,
which a worker could finish between being seen running and being signalled."""


def _long_search(scenario: dict[str, Any]) -> dict[str, Any]:
    """`scenario` on COPIES copies of its nodes (the first copy keeps their names) with a
    batch COPIES times as large."""
    nodes = scenario["cluster"]["nodes"]
    return {**scenario,
            "cluster": {**scenario["cluster"], "nodes": [
                {**node, "name": node["name"] if k == 0 else f"{node['name']}-copy{k}"}
                for k in range(COPIES) for node in nodes]},
            "job": {**scenario["job"],
                    "global_batch_size": scenario["job"]["global_batch_size"] * COPIES}}


def _start_worker(database_url: str, lease_s: float, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HETPLAN_DATABASE_URL": database_url,
           "HETPLAN_JOB_LEASE_S": str(lease_s), "HETPLAN_JOB_POLL_S": "0.1",
           "HETPLAN_SOLVER_WORKERS": "1"}
    with log.open("wb") as sink:  # the child has its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()",
                                 "worker"], env=env, cwd=Path(__file__).parents[2],
                                stdout=subprocess.DEVNULL, stderr=sink)


@pytest.mark.slow
def test_worker_killed_mid_job_is_taken_over_and_the_job_succeeds(
        make_client: MakeClient, database_url: str, scenario: dict[str, Any],
        plan_document: dict[str, Any], tmp_path: Path) -> None:
    api = make_client(embedded_worker=False)
    log = tmp_path / "worker.log"
    process = _start_worker(database_url, lease_s=1.0, log=log)
    try:
        response = api.post("/v1/plans?job=true", json={"scenario": _long_search(scenario),
                                                         "options": {"time_limit_s": 20}})
        job_id = response.json()["id"]
        deadline = time.monotonic() + 30
        while api.get(f"/v1/jobs/{job_id}").json()["status"] != "running":
            assert time.monotonic() < deadline, "the worker never claimed the job"
            assert process.poll() is None, log.read_text()
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)  # mid-search: no chance to release the job
        process.wait()
        # The plan on the first copy of the nodes, its micro-batches covering the batch.
        make_client(solver=fixed_solver({**plan_document, "pipelines": [
            {**pipeline, "num_micro_batches": pipeline["num_micro_batches"] * COPIES}
            for pipeline in plan_document["pipelines"]]}), **FAST)
        job = wait_job(api, job_id)
        assert (job["status"], job["attempts"]) == ("succeeded", 2)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_worker_stopped_with_sigterm_queues_its_job_again(
        make_client: MakeClient, database_url: str, scenario: dict[str, Any],
        tmp_path: Path) -> None:
    api = make_client(embedded_worker=False)
    log = tmp_path / "worker.log"
    process = _start_worker(database_url, lease_s=30.0, log=log)
    try:
        job_id = api.post("/v1/plans?job=true", json={
            "scenario": _long_search(scenario), "options": {"time_limit_s": 20}}).json()["id"]
        deadline = time.monotonic() + 30
        while api.get(f"/v1/jobs/{job_id}").json()["status"] != "running":
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0, log.read_text()
        job = api.get(f"/v1/jobs/{job_id}").json()
        assert (job["status"], job["attempts"], job["progress"]) == ("queued", 0, 0.0)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
