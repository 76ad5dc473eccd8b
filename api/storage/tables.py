"""The schema, as SQLAlchemy Core tables. Alembic's migrations own the database's copy;
`tests/api/test_storage.py` checks that a migrated database matches these tables.

Uploads are append-only: a new upload is a new `*_sets` row with a higher `version`, so no
stored version is ever changed. A link set holds its complete row list (rows carried over
from the previous version are marked `uploaded = false`). A profile set holds only the
rows of its own upload: the content of version v is, for each point, the row of the
newest version <= v that uploaded it (links are few; profiles may be 100,000 rows).
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = [
    "metadata",
    "gpu_types",
    "models",
    "clusters",
    "profile_sets",
    "profile_rows",
    "link_sets",
    "link_rows",
    "plans",
    "jobs",
]

metadata = sa.MetaData()

NAME = sa.String(200)
KEY = sa.String(200)


def _catalogue(name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", NAME, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("document", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("name", "version", name=f"uq_{name}_name_version"),
    )


gpu_types = _catalogue("gpu_types")
models = _catalogue("models")
clusters = _catalogue("clusters")

profile_sets = sa.Table(
    "profile_sets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("model", NAME, nullable=False),
    sa.Column("gpu_type", NAME, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("source", sa.JSON, nullable=True),
    sa.Column("idempotency_key", KEY, nullable=True, unique=True),
    sa.Column("body_sha256", sa.String(64), nullable=False),
    sa.Column("row_count", sa.Integer, nullable=False),
    sa.Column("uploaded_count", sa.Integer, nullable=False),
    sa.Column("replaced_count", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("model", "gpu_type", "version", name="uq_profile_sets_version"),
)

profile_rows = sa.Table(
    "profile_rows",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "set_id", sa.Integer, sa.ForeignKey("profile_sets.id", ondelete="CASCADE"),
        nullable=False, index=True,
    ),
    sa.Column("kind", NAME, nullable=False),
    sa.Column("micro_batch", sa.Integer, nullable=False),
    sa.Column("tp", sa.Integer, nullable=False),
    sa.Column("forward_ms", sa.Float, nullable=False),
    sa.Column("backward_ms", sa.Float, nullable=False),
    sa.Column("activation_bytes", sa.Float, nullable=False),
    sa.UniqueConstraint("set_id", "kind", "micro_batch", "tp", name="uq_profile_rows_point"),
)

link_sets = sa.Table(
    "link_sets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("version", sa.Integer, nullable=False, unique=True),
    sa.Column("idempotency_key", KEY, nullable=True, unique=True),
    sa.Column("body_sha256", sa.String(64), nullable=False),
    sa.Column("row_count", sa.Integer, nullable=False),
    sa.Column("uploaded_count", sa.Integer, nullable=False),
    sa.Column("replaced_count", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

link_rows = sa.Table(
    "link_rows",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "set_id", sa.Integer, sa.ForeignKey("link_sets.id", ondelete="CASCADE"),
        nullable=False, index=True,
    ),
    sa.Column("scope", sa.String(20), nullable=False),
    sa.Column("gpu_type", NAME, nullable=True),
    sa.Column("zone_a", NAME, nullable=True),
    sa.Column("zone_b", NAME, nullable=True),
    sa.Column("bandwidth_gb_per_s", sa.Float, nullable=False),
    sa.Column("latency_us", sa.Float, nullable=False),
    sa.Column("uploaded", sa.Boolean, nullable=False),
)

plans = sa.Table(
    "plans",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("wall_s", sa.Float, nullable=False),
    sa.Column("document", sa.JSON, nullable=False),
    sa.Column("evaluation", sa.JSON, nullable=False),
    sa.Column("unused_gpus", sa.JSON, nullable=False),
    sa.Column("sources", sa.JSON, nullable=False),
    sa.Column("options", sa.JSON, nullable=False),
    sa.Column("scenario", sa.JSON, nullable=False),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("progress", sa.Float, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("plan_id", sa.String(32), nullable=True),
    sa.Column("error", sa.JSON, nullable=True),
    sa.Column("cancel_requested", sa.Boolean, nullable=False),
    sa.Column("kind", sa.String(20), nullable=False, server_default="plan"),
    sa.Column("request", sa.JSON, nullable=True),
    sa.Column("result", sa.JSON, nullable=True),
    sa.Column("owner", sa.String(200), nullable=True),
    sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Index("ix_jobs_status_created", "status", "created_at"),
)
"""A job is durable: `request` holds everything a worker needs to run it (the assembled
scenario, options, the sweep's fleets), so any worker process may claim it. `owner` is the
worker running it until `lease_expires_at`, which that worker keeps moving forward; a job
whose lease lapsed is claimed again, at most `max_job_attempts` times in all (`attempts`).
`result` holds the answer of a sweep (pareto, what-if), whose plans are stored as plans."""
