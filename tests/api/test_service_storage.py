"""The store on both databases: migrations, atomic uploads, concurrent versions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient

from api.storage import Store, make_engine, migrate
from api.storage.store import ProfilePoint
from api.storage.tables import metadata
from tests.api.conftest import MakeClient

POINTS = [ProfilePoint(kind="block", micro_batch=b, tp=1, forward_ms=1.0, backward_ms=2.0,
                       activation_bytes=10.0) for b in (1, 2, 4, 8)]
TABLES = ("profile_sets", "profile_rows")


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    engine = make_engine(database_url)
    migrate(engine)
    yield Store(engine)
    engine.dispose()


def add(store: Store, key: str | None = None, points: list[ProfilePoint] = POINTS) -> Any:
    return store.add_profile_set(model="m", gpu_type="g", rows=points, source=None,
                                 body_sha256="0" * 64, idempotency_key=key)


def test_migrated_schema_matches_the_tables(store: Store) -> None:
    with store.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), metadata)
    assert differences == []


def test_migrating_twice_changes_nothing(store: Store) -> None:
    migrate(store.engine)
    assert store.count_rows(TABLES) == {"profile_sets": 0, "profile_rows": 0}


class Interrupted(Exception):
    pass


def interrupt_row_inserts(engine: sa.Engine) -> None:
    """Make the engine fail as a dropped connection would, once the version row is in and
    the first batch of profile rows is on its way."""

    def fail(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO PROFILE_ROWS"):
            raise Interrupted("connection lost mid-upload")

    sa.event.listen(engine, "before_cursor_execute", fail)


def test_interrupted_upload_leaves_no_partial_rows(store: Store) -> None:
    add(store)
    before = store.count_rows(TABLES)
    interrupt_row_inserts(store.engine)
    with pytest.raises(Interrupted):
        add(store, points=[*POINTS, ProfilePoint(kind="head", micro_batch=1, tp=1,
                                                 forward_ms=1, backward_ms=1,
                                                 activation_bytes=1)])
    assert store.count_rows(TABLES) == before
    assert store.find_profile_set("m", "g").version == 1


def test_interrupted_upload_through_the_api_is_a_clean_failure(
        make_client: MakeClient) -> None:
    client = make_client()
    engine = client.app.state.store.engine  # type: ignore[attr-defined]
    interrupt_row_inserts(engine)
    broken = TestClient(client.app, raise_server_exceptions=False)
    response = broken.post("/v1/profiles", json={"model": "m", "gpu_type": "g", "rows": [
        {"kind": "b", "micro_batch": 1, "tp": 1, "forward_ms": 1, "backward_ms": 1,
         "activation_bytes": 1}]})
    assert response.status_code == 500  # an internal failure, said as such
    assert response.json()["error"] == "internal"
    counts = client.app.state.store.count_rows(TABLES)  # type: ignore[attr-defined]
    assert counts == {"profile_sets": 0, "profile_rows": 0}


def test_concurrent_uploads_get_distinct_versions(store: Store) -> None:
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            add(store)
        except BaseException as error:  # collected and re-raised by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=upload) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    sets, count = store.list_profile_sets(model="m")
    assert sorted(s.version for s in sets) == [1, 2, 3, 4, 5, 6] and count == 6
    assert store.count_rows(["profile_rows"]) == {"profile_rows": 6 * len(POINTS)}


def test_concurrent_uploads_with_one_key_store_one_version(store: Store) -> None:
    answers: list[Any] = []

    def upload() -> None:
        answers.append(add(store, key="same"))

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {a.id for a in answers} == {answers[0].id}
    assert store.list_profile_sets()[1] == 1


def test_catalogue_versions_are_kept(store: Store) -> None:
    from api.storage import Catalogue

    store.put_document(Catalogue.MODEL, "m", {"seq_len": 1})
    store.put_document(Catalogue.MODEL, "m", {"seq_len": 2})
    assert store.get_document(Catalogue.MODEL, "m").document == {"seq_len": 2}
    assert store.get_document(Catalogue.MODEL, "m", 1).document == {"seq_len": 1}


def count_integrity_errors(engine: sa.Engine) -> list[BaseException]:
    """Every unique-constraint violation the database reports on `engine`, as it happens."""
    seen: list[BaseException] = []

    def record(context: Any) -> None:
        if isinstance(context.sqlalchemy_exception, sa.exc.IntegrityError):
            seen.append(context.sqlalchemy_exception)

    sa.event.listen(engine, "handle_error", record)
    return seen


def test_concurrent_uploads_of_one_model_and_gpu_type_queue_instead_of_colliding(
        store: Store) -> None:
    collisions = count_integrity_errors(store.engine)
    start = threading.Barrier(12)

    def upload() -> None:
        start.wait()
        add(store)

    threads = [threading.Thread(target=upload) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert collisions == []
    sets, count = store.list_profile_sets(model="m")
    assert sorted(s.version for s in sets) == list(range(1, 13)) and count == 12


def test_upload_that_keeps_colliding_answers_409_with_retry_after(
        make_client: MakeClient) -> None:
    client = make_client()
    engine = client.app.state.store.engine  # type: ignore[attr-defined]

    def collide(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO GPU_TYPES"):
            raise sa.exc.IntegrityError(statement, {}, Exception("duplicate key"))

    sa.event.listen(engine, "before_cursor_execute", collide)
    response = client.post("/v1/gpu-types", json={"name": "A100", "memory_gib": 80})
    assert response.status_code == 409
    assert response.json()["error"] == "conflict"
    assert response.headers["retry-after"] == "1"


def test_first_start_killed_half_way_leaves_no_schema_and_the_next_start_works(
        database_url: str) -> None:
    engine = make_engine(database_url)

    def die(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("CREATE TABLE PROFILE_ROWS"):
            raise Interrupted("killed during the first start")

    sa.event.listen(engine, "before_cursor_execute", die)
    with pytest.raises(Interrupted):
        migrate(engine)
    assert set(sa.inspect(engine).get_table_names()) - {"alembic_version"} == set()
    sa.event.remove(engine, "before_cursor_execute", die)
    migrate(engine)
    assert {"gpu_types", "profile_rows", "jobs"} <= set(sa.inspect(engine).get_table_names())
    engine.dispose()


def point(micro_batch: int, forward_ms: float, kind: str = "block") -> ProfilePoint:
    return ProfilePoint(kind=kind, micro_batch=micro_batch, tp=1, forward_ms=forward_ms,
                        backward_ms=2.0, activation_bytes=10.0)


def content(store: Store, version: int) -> list[tuple[int, float, bool]]:
    record = store.find_profile_set("m", "g", version)
    assert record is not None
    return [(p.micro_batch, p.forward_ms, p.uploaded) for p in record.rows]


def test_an_upload_writes_only_its_own_rows_and_shares_the_rest(store: Store) -> None:
    add(store, points=[point(1, 1.0), point(2, 1.0), point(4, 1.0)])
    second = add(store, points=[point(2, 2.0), point(8, 2.0)])
    third = add(store, points=[point(1, 3.0)])
    assert store.count_rows(["profile_rows"]) == {"profile_rows": 6}
    assert content(store, 1) == [(1, 1.0, True), (2, 1.0, True), (4, 1.0, True)]
    assert content(store, 2) == [(1, 1.0, False), (2, 2.0, True), (4, 1.0, False),
                                 (8, 2.0, True)]
    assert content(store, 3) == [(1, 3.0, True), (2, 2.0, False), (4, 1.0, False),
                                 (8, 2.0, False)]
    assert (second.row_count, second.uploaded_count, second.replaced_count) == (4, 2, 1)
    assert (third.row_count, third.uploaded_count, third.replaced_count) == (4, 1, 1)


def test_a_profile_version_is_read_a_page_at_a_time(store: Store) -> None:
    first = add(store, points=[point(b, 1.0) for b in (1, 2, 4, 8)])
    add(store, points=[point(2, 2.0)])
    page = store.get_profile_set(first.id, limit=2, offset=1)
    assert [(p.micro_batch, p.forward_ms) for p in page.rows] == [(2, 1.0), (4, 1.0)]
    assert page.row_count == 4


def test_newest_profile_rows_are_paged_and_filtered_in_the_database(store: Store) -> None:
    statements: list[str] = []
    add(store, points=[point(1, 1.0), point(2, 1.0, kind="head")])
    add(store, points=[point(1, 2.0)])
    store.add_profile_set(model="m", gpu_type="h", rows=[point(1, 5.0)], source=None,
                          body_sha256="1" * 64)
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda conn, cursor, statement, *args: statements.append(statement))
    rows, count = store.newest_profile_rows(model="m", gpu_type=None, kind="block", limit=1,
                                            offset=1)
    assert count == 2
    assert [(r.gpu_type, r.version, r.point.forward_ms, r.point.uploaded) for r in rows] == [
        ("h", 1, 5.0, True)]
    assert any("LIMIT" in s.upper() and "OFFSET" in s.upper() for s in statements)
    rows, count = store.newest_profile_rows(model="m", gpu_type="g", kind=None, limit=10,
                                            offset=0)
    assert [(r.point.kind, r.version, r.point.forward_ms, r.point.uploaded) for r in rows] == [
        ("block", 2, 2.0, True), ("head", 2, 1.0, False)]


def _alembic(engine: sa.Engine, step: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from api.storage.db import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, step)(config, revision)


def test_migration_0002_drops_copied_rows_and_keeps_every_version_as_it_was(
        database_url: str) -> None:
    engine = make_engine(database_url)
    migrate(engine, "0001")
    sets, rows = sa.table("profile_sets", *(sa.column(c) for c in (
        "id", "model", "gpu_type", "version", "body_sha256", "row_count", "uploaded_count",
        "replaced_count", "created_at"))), sa.table("profile_rows", *(sa.column(c) for c in (
            "set_id", "kind", "micro_batch", "tp", "forward_ms", "backward_ms",
            "activation_bytes", "uploaded")))
    with engine.begin() as connection:
        for version, (count, uploaded, replaced) in enumerate([(2, 2, 0), (2, 1, 1)], 1):
            connection.execute(sa.insert(sets).values(
                id=version, model="m", gpu_type="g", version=version, body_sha256="0" * 64,
                row_count=count, uploaded_count=uploaded, replaced_count=replaced,
                created_at=datetime(2026, 12, 1)))
        connection.execute(sa.insert(rows), [  # the old layout: version 2 copies point 1
            {"set_id": s, "kind": "block", "micro_batch": b, "tp": 1, "forward_ms": f,
             "backward_ms": 1.0, "activation_bytes": 1.0, "uploaded": u}
            for s, b, f, u in [(1, 1, 1.0, True), (1, 2, 1.0, True), (2, 1, 1.0, False),
                               (2, 2, 2.0, True)]])
    migrate(engine)
    store = Store(engine)
    assert store.count_rows(["profile_rows"]) == {"profile_rows": 3}
    assert content(store, 1) == [(1, 1.0, True), (2, 1.0, True)]
    assert content(store, 2) == [(1, 1.0, False), (2, 2.0, True)]
    _alembic(engine, "downgrade", "0001")
    with engine.connect() as connection:
        restored = connection.execute(sa.select(rows).order_by(rows.c.set_id,
                                                               rows.c.micro_batch)).all()
    assert [(r.set_id, r.micro_batch, r.forward_ms, r.uploaded) for r in restored] == [
        (1, 1, 1.0, True), (1, 2, 1.0, True), (2, 1, 1.0, False), (2, 2, 2.0, True)]
    engine.dispose()


def test_migration_0003_keeps_finished_jobs_and_fails_unfinished_ones_saying_why(
        database_url: str) -> None:
    engine = make_engine(database_url)
    migrate(engine, "0002")
    jobs = sa.table("jobs", *(sa.column(c) for c in (
        "id", "created_at", "updated_at", "status", "progress", "message", "plan_id", "error",
        "cancel_requested")))
    when = datetime(2026, 12, 1)
    with engine.begin() as connection:
        connection.execute(sa.insert(jobs), [
            {"id": job_id, "created_at": when, "updated_at": when, "status": status,
             "progress": 1.0 if status == "succeeded" else 0.5, "message": status,
             "plan_id": "ab" * 16 if status == "succeeded" else None, "error": None,
             "cancel_requested": False}
            for job_id, status in [("a" * 32, "succeeded"), ("b" * 32, "running"),
                                   ("c" * 32, "queued")]])
    migrate(engine)
    store = Store(engine)
    done = store.get_job("a" * 32)
    assert (done.status.value, done.plan_id, done.kind.value, done.attempts, done.owner) == (
        "succeeded", "ab" * 16, "plan", 0, None)
    for job_id in ("b" * 32, "c" * 32):
        lost = store.get_job(job_id)
        assert lost.status.value == "failed"
        assert lost.error is not None and lost.error["error"] == "job_not_resumable"
    _alembic(engine, "downgrade", "0002")
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(jobs)).scalar() == 3
    engine.dispose()
