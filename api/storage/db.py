"""Engines and migrations: the only place where SQLite and PostgreSQL differ."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

__all__ = ["make_engine", "migrate", "normalise_url", "write_transaction", "MIGRATIONS"]

MIGRATIONS = Path(__file__).parent / "migrations"
"""Alembic's script directory, shipped inside the package so a wheel install can migrate."""

_MIGRATION_LOCK = "hetplan:migrate"  # serialises concurrent starts of several processes
_WRITE_OPTION = "hetplan_write"


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3, the driver we install."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Python's sqlite3 would open transactions itself, and only before INSERT/UPDATE/DELETE:
    # DDL then ran outside any transaction (a first start killed half-way left half a
    # schema). With its own handling off, `_sqlite_begin` opens every transaction.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")  # wait for a writer instead of failing
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection: sa.Connection) -> None:
    # A writer takes the database's write lock when its transaction opens, so two writers
    # (threads or processes) queue on busy_timeout instead of both reading version n and
    # one failing on commit; readers stay deferred and never wait for a writer (WAL).
    writing = connection.get_execution_options().get(_WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writing else "BEGIN")


def _advisory_lock_id(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


@contextmanager
def write_transaction(engine: sa.Engine, lock_key: str | None = None
                      ) -> Iterator[sa.Connection]:
    """One transaction that writers of `lock_key` pass through one at a time: SQLite's
    database write lock (taken at BEGIN), PostgreSQL's transaction-scoped advisory lock
    on the key. Both are released at commit or rollback, also when the process dies."""
    with engine.connect() as connection:
        connection.execution_options(**{_WRITE_OPTION: True})
        with connection.begin():
            if lock_key is not None and connection.dialect.name == "postgresql":
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                                   {"k": _advisory_lock_id(lock_key)})
            yield connection


def make_engine(url: str, **options: Any) -> sa.Engine:
    """An engine for `url`, with the settings each backend needs for a threaded server."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False}, pool_size=8, max_overflow=8, **options
        )
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        sa.event.listen(engine, "begin", _sqlite_begin)
        return engine
    return sa.create_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True, **options)


def migrate(engine: sa.Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` with Alembic (a no-op when it is already there), in
    one transaction on both databases: a start killed half-way leaves no schema at all."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with write_transaction(engine, _MIGRATION_LOCK) as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
