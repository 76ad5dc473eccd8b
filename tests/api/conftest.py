"""Fixtures of the service tests: an app on a fresh database, SQLite and PostgreSQL.

Every test that takes `client` (or `make_client`) runs once per backend. PostgreSQL is
the server at 127.0.0.1:5432 (trust auth, database `test`; override with
HETPLAN_TEST_PG_URL); each test gets its own schema, dropped afterwards. When the server
is not reachable the PostgreSQL variants are skipped with the reason.
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import planner
from api.app import create_app
from api.services.planning import Solver
from api.settings import Settings
from planner.search import PlanResult, PlanStatus

DATA = Path(__file__).parent / "data"
PG_URL = os.environ.get("HETPLAN_TEST_PG_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_problem() -> str | None:
    try:
        engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as error:  # any failure to connect means: skip, saying why
        return f"PostgreSQL at {PG_URL} is not reachable: {type(error).__name__}: {error}"
    return None


_PG_PROBLEM = _pg_problem()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'hetplan.db'}"
        return
    if _PG_PROBLEM:
        pytest.skip(_PG_PROBLEM)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def scenario() -> dict[str, Any]:
    """A small two-type scenario (16 A100 + 16 V100, GPT 1.3B) from the shared set."""
    return json.loads((DATA / "scenario.json").read_text())


@pytest.fixture
def plan_document() -> dict[str, Any]:
    """A valid plan of `scenario` (its heterogeneity-unaware baseline)."""
    return json.loads((DATA / "plan.json").read_text())


def fixed_solver(plan_document: dict[str, Any], *, progress_steps: int = 1,
                 status: PlanStatus = PlanStatus.HEURISTIC) -> Solver:
    """A solver that answers with `plan_document`, really evaluated, after reporting
    progress `progress_steps` times: for tests of the service around the search."""

    def solve(scenario: planner.Scenario, options: planner.SearchOptions,
              progress: Any) -> PlanResult:
        for step in range(progress_steps):
            if progress is not None:
                progress(step / progress_steps, f"step {step}")
        plan = planner.parse_plan(copy.deepcopy(plan_document))
        return PlanResult(plan=plan, evaluation=planner.evaluate(scenario, plan),
                          status=status, wall_s=0.001)

    return solve


MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(database_url: str) -> Iterator[MakeClient]:
    """Build apps on this test's database: `make_client(solver=..., **settings)`."""
    clients: list[TestClient] = []

    def make(*, solver: Solver | None = None, **settings: Any) -> TestClient:
        # Searches at the server's default niceness (10) starved behind the other test
        # worker's processes and met their hard deadline: tests of the deadline itself
        # use ProcessSolver directly, and the niceness has a test of its own.
        settings.setdefault("search_niceness", 0)
        app = create_app(Settings(database_url=database_url, **settings), solver=solver)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in reversed(clients):
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    """An app with the real planner, no auth, default settings."""
    return make_client()


def register_catalogue(client: TestClient, scenario: dict[str, Any], *,
                       cluster: str = "lab", headers: dict[str, str] | None = None) -> None:
    """Store everything `scenario` holds: GPU types, model, cluster, links, profiles."""
    headers = headers or {}
    for name, gpu in scenario["gpu_types"].items():
        fields = {k: gpu[k] for k in ("memory_gib", "peak_tflops", "hourly_usd") if k in gpu}
        _ok(client.post("/v1/gpu-types", json={"name": name, **fields}, headers=headers))
    _ok(client.post("/v1/models", json=scenario["model"], headers=headers))
    _ok(client.post("/v1/clusters", json={"name": cluster, "nodes": scenario["cluster"]["nodes"]},
                    headers=headers))
    links = [{"scope": "intra_node", "gpu_type": g, **v}
             for g, v in scenario["cluster"]["intra_node"].items()]
    links.append({"scope": "inter_node", **scenario["cluster"]["inter_node"]})
    _ok(client.post("/v1/links", json={"links": links}, headers=headers))
    for gpu_type in scenario["gpu_types"]:
        _ok(client.post("/v1/profiles", headers=headers, json={
            "model": scenario["model"]["name"], "gpu_type": gpu_type,
            "rows": profile_rows(scenario, gpu_type)}))


def profile_rows(scenario: dict[str, Any], gpu_type: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "gpu_type"}
            for row in scenario["profiles"] if row["gpu_type"] == gpu_type]


def _ok(response: Any) -> None:
    assert response.status_code == 201, response.text
