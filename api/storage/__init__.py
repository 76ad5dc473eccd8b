"""Storage: SQLAlchemy Core tables, Alembic migrations, and the `Store` that reads and writes
them. One code path serves SQLite and PostgreSQL; only the engine options differ."""

from api.storage.db import make_engine, migrate
from api.storage.store import (
    Catalogue,
    ClaimedJob,
    JobKind,
    JobRecord,
    JobStatus,
    LeaseState,
    LinkSetRecord,
    PlanRecord,
    ProfileSetRecord,
    Store,
    Versioned,
)

__all__ = [
    "Catalogue",
    "ClaimedJob",
    "JobKind",
    "JobRecord",
    "JobStatus",
    "LeaseState",
    "LinkSetRecord",
    "PlanRecord",
    "ProfileSetRecord",
    "Store",
    "Versioned",
    "make_engine",
    "migrate",
]
