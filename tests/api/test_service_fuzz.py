"""A bounded schemathesis pass over the whole OpenAPI document, on SQLite and on
PostgreSQL, with every check schemathesis has (no 5xx, documented status codes, headers
and content types, answers matching their schemas, schema-violating requests refused,
schema-valid ones accepted, auth as declared).

Two checks are told what JSON Schema cannot say:
- a schema-valid body may still get 422: rules across fields (a row's `gpu_type` must be
  the upload's, layers must use declared kinds) and names of stored things (a cluster
  naming an unregistered GPU type) are checked by the service, and said in `problems`;
- any body, schema-valid or not, may get 413 when it is larger than `max_body_bytes`
  (an array near or past its `maxItems` usually is).

Schemathesis needs the schema when it makes the tests, so the apps are built at import
(not started: the module fixtures do that):
on a SQLite file in a temporary folder, and in a fresh PostgreSQL schema when the server
is reachable; the module fixture removes both.

The apps answer plan requests with a fixed, really evaluated plan instead of searching:
the OpenAPI examples form a story that ends in a plannable request, and a real search
per fuzzed request would make this pass about ten times slower and fill the job queue
(the search has its own tests; admission control has test_service_plans).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from api.app import create_app
from api.settings import Settings
from api.storage import make_engine, migrate
from tests.api.conftest import _PG_PROBLEM, DATA, PG_URL, fixed_solver, register_catalogue

_FOLDER = Path(tempfile.mkdtemp(prefix="hetplan-fuzz-"))
_PG_SCHEMA = f"fuzz_{uuid.uuid4().hex[:12]}"
_LIMITS = {"max_time_limit_s": 0.5, "sync_solve_threshold_s": 1, "max_body_bytes": 256 * 1024,
           "max_pending_jobs": 100_000}
"""The examples' plan requests now succeed, so fuzzed `?job=true` requests really queue
jobs; a full queue answers 503 `overloaded` by design (test_service_plans checks it),
which is not the server error this pass looks for."""


_SOLVER = fixed_solver(json.loads((DATA / "plan.json").read_text()))


def _app(database_url: str, **settings: Any) -> FastAPI:
    return create_app(Settings(database_url=database_url, **_LIMITS, **settings),
                      solver=_SOLVER)


SQLITE_APP = _app(f"sqlite:///{_FOLDER / 'fuzz.db'}")
PG_URL_FUZZ = f"{PG_URL}?options=-csearch_path%3D{_PG_SCHEMA}"
PG_APP = _app(PG_URL_FUZZ, migrate_on_startup=False)
"""Its schema is made (and migrated) by the fixture, not at import."""
_CHECKS = SchemathesisConfig.from_dict({"checks": {
    "positive_data_acceptance": {"expected-statuses": ["2xx", "3xx", "401", "403", "404",
                                                       "409", "413", "422", "429", "503"]},
    "negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "405",
                                                      "406", "409", "413", "415", "422"]},
}})
# The schemas come from the apps' own OpenAPI documents, not through `from_asgi`, whose
# client started the apps (their job workers' threads) at import and never stopped them:
# they ran through the whole test session. The module fixtures start and stop the apps.
sqlite_schema = schemathesis.openapi.from_dict(SQLITE_APP.openapi(), config=_CHECKS)
pg_schema = schemathesis.openapi.from_dict(PG_APP.openapi(), config=_CHECKS)
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


def _serve(app: FastAPI) -> Iterator[None]:
    with TestClient(app) as client:
        register_catalogue(client, json.loads((DATA / "scenario.json").read_text()))
        yield


@pytest.fixture(scope="module")
def sqlite_served() -> Iterator[None]:
    try:
        yield from _serve(SQLITE_APP)
    finally:
        shutil.rmtree(_FOLDER, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_served() -> Iterator[None]:
    if _PG_PROBLEM:
        pytest.skip(_PG_PROBLEM)
    admin = sa.create_engine(PG_URL)
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{_PG_SCHEMA}"'))
    try:
        engine = make_engine(PG_URL_FUZZ)
        migrate(engine)
        engine.dispose()
        yield from _serve(PG_APP)
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{_PG_SCHEMA}" CASCADE'))
        admin.dispose()


@sqlite_schema.parametrize()
@FUZZ
def test_every_schemathesis_check_passes_on_sqlite(case: Any, sqlite_served: None) -> None:
    case.call_and_validate(app=SQLITE_APP)


@pg_schema.parametrize()
@FUZZ
def test_every_schemathesis_check_passes_on_postgresql(case: Any, pg_served: None) -> None:
    case.call_and_validate(app=PG_APP)
