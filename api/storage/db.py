"""Engines and migrations: the only place where SQLite and PostgreSQL differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

__all__ = ["make_engine", "migrate", "normalise_url", "MIGRATIONS"]

MIGRATIONS = Path(__file__).parent / "migrations"
"""Alembic's script directory, shipped inside the package so a wheel install can migrate."""

_PG_MIGRATION_LOCK = 0x6865_7470  # "hetp": serialises concurrent starts of several workers


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3, the driver we install."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")  # wait for a writer instead of failing
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str, **options: Any) -> sa.Engine:
    """An engine for `url`, with the settings each backend needs for a threaded server."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False}, pool_size=8, max_overflow=8, **options
        )
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return sa.create_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True, **options)


def migrate(engine: sa.Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` with Alembic (a no-op when it is already there)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                               {"k": _PG_MIGRATION_LOCK})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
