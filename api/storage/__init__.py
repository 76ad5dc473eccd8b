"""Storage: SQLAlchemy Core tables, Alembic migrations, and the `Store` that reads and writes
them. One code path serves SQLite and PostgreSQL; only the engine options differ."""

from api.storage.db import make_engine, migrate
from api.storage.store import (
    Catalogue,
    JobRecord,
    JobStatus,
    LinkSetRecord,
    PlanRecord,
    ProfileSetRecord,
    Store,
    Versioned,
)

__all__ = [
    "Catalogue",
    "JobRecord",
    "JobStatus",
    "LinkSetRecord",
    "PlanRecord",
    "ProfileSetRecord",
    "Store",
    "Versioned",
    "make_engine",
    "migrate",
]
