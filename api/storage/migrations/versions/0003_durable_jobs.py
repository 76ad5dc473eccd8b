"""Durable jobs: a job keeps its request, and workers claim it under a lease.

Jobs used to run in the process that accepted them, from arguments held in memory, so a
job of a process that died was lost. Now a job row holds its `request` (what a worker needs
to run it), its `kind` (plan, pareto, whatif), the `owner` worker and when its lease
ends, how many `attempts` were started, and a sweep's `result`. Unfinished jobs of the old
schema have no request to run again: upgrading fails them, saying so.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_NOT_RESUMABLE = {
    "error": "job_not_resumable",
    "message": "this plan job was queued or running when the service was upgraded to "
               "durable jobs, and its request was not stored; request the plan again",
    "problems": [],
}


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(20), nullable=False,
                                   server_default="plan"))
        batch.add_column(sa.Column("request", sa.JSON, nullable=True))
        batch.add_column(sa.Column("result", sa.JSON, nullable=True))
        batch.add_column(sa.Column("owner", sa.String(200), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer, nullable=False,
                                   server_default="0"))
        batch.create_index("ix_jobs_status_created", ["status", "created_at"])
    jobs = sa.table("jobs", sa.column("status", sa.String), sa.column("error", sa.JSON),
                    sa.column("message", sa.Text),
                    sa.column("updated_at", sa.DateTime(timezone=True)))
    op.get_bind().execute(
        sa.update(jobs).where(jobs.c.status.in_(["queued", "running"])).values(
            status="failed", error=_NOT_RESUMABLE, message="not resumable after the upgrade",
            updated_at=datetime.now(UTC)))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_status_created")
        for column in ("attempts", "lease_expires_at", "owner", "result", "request", "kind"):
            batch.drop_column(column)
