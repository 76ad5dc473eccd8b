"""Initial schema: catalogue, versioned profile and link uploads, plans, jobs.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def _catalogue(name: str) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("document", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("name", "version", name=f"uq_{name}_name_version"),
    )


def upgrade() -> None:
    for name in ("gpu_types", "models", "clusters"):
        _catalogue(name)
    op.create_table(
        "profile_sets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("gpu_type", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("source", sa.JSON, nullable=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True, unique=True),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("row_count", sa.Integer, nullable=False),
        sa.Column("uploaded_count", sa.Integer, nullable=False),
        sa.Column("replaced_count", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("model", "gpu_type", "version", name="uq_profile_sets_version"),
    )
    op.create_table(
        "profile_rows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("set_id", sa.Integer,
                  sa.ForeignKey("profile_sets.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(200), nullable=False),
        sa.Column("micro_batch", sa.Integer, nullable=False),
        sa.Column("tp", sa.Integer, nullable=False),
        sa.Column("forward_ms", sa.Float, nullable=False),
        sa.Column("backward_ms", sa.Float, nullable=False),
        sa.Column("activation_bytes", sa.Float, nullable=False),
        sa.Column("uploaded", sa.Boolean, nullable=False),
    )
    op.create_index("ix_profile_rows_set_id", "profile_rows", ["set_id"])
    op.create_table(
        "link_sets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("version", sa.Integer, nullable=False, unique=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True, unique=True),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("row_count", sa.Integer, nullable=False),
        sa.Column("uploaded_count", sa.Integer, nullable=False),
        sa.Column("replaced_count", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "link_rows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("set_id", sa.Integer,
                  sa.ForeignKey("link_sets.id", ondelete="CASCADE"), nullable=False),
        sa.Column("scope", sa.String(20), nullable=False),
        sa.Column("gpu_type", sa.String(200), nullable=True),
        sa.Column("zone_a", sa.String(200), nullable=True),
        sa.Column("zone_b", sa.String(200), nullable=True),
        sa.Column("bandwidth_gb_per_s", sa.Float, nullable=False),
        sa.Column("latency_us", sa.Float, nullable=False),
        sa.Column("uploaded", sa.Boolean, nullable=False),
    )
    op.create_index("ix_link_rows_set_id", "link_rows", ["set_id"])
    op.create_table(
        "plans",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("wall_s", sa.Float, nullable=False),
        sa.Column("document", sa.JSON, nullable=False),
        sa.Column("evaluation", sa.JSON, nullable=False),
        sa.Column("unused_gpus", sa.JSON, nullable=False),
        sa.Column("sources", sa.JSON, nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("scenario", sa.JSON, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("progress", sa.Float, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("plan_id", sa.String(32), nullable=True),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
    )


def downgrade() -> None:
    for name in ("jobs", "plans", "link_rows", "link_sets", "profile_rows", "profile_sets",
                 "clusters", "models", "gpu_types"):
        op.drop_table(name)
