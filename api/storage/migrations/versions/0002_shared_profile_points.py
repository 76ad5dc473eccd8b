"""Profile versions share unchanged points instead of copying them.

A version used to hold a copy of every earlier point it did not replace (`uploaded =
false`), so each upload of a large profile rewrote the whole history. Now a version stores
only the rows of its own upload, and its content is, for each point, the row of the newest
version at or before it that uploaded the point. Upgrading drops the copies, which are
exactly those rows; downgrading makes them again.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_POINT = ["set_id", "kind", "micro_batch", "tp"]


def upgrade() -> None:
    op.get_bind().execute(sa.text("DELETE FROM profile_rows WHERE uploaded = :no"),
                          {"no": False})
    with op.batch_alter_table("profile_rows") as batch:
        batch.drop_column("uploaded")
        batch.create_unique_constraint("uq_profile_rows_point", _POINT)


_COPY_CARRIED_ROWS = sa.text("""
INSERT INTO profile_rows (set_id, kind, micro_batch, tp, forward_ms, backward_ms,
                          activation_bytes, uploaded)
SELECT later.id, r.kind, r.micro_batch, r.tp, r.forward_ms, r.backward_ms,
       r.activation_bytes, :no
FROM profile_sets later
JOIN profile_sets earlier ON earlier.model = later.model
     AND earlier.gpu_type = later.gpu_type AND earlier.version < later.version
JOIN profile_rows r ON r.set_id = earlier.id
WHERE NOT EXISTS (
    SELECT 1 FROM profile_rows newer
    JOIN profile_sets s ON s.id = newer.set_id
    WHERE s.model = later.model AND s.gpu_type = later.gpu_type
      AND s.version > earlier.version AND s.version <= later.version
      AND newer.kind = r.kind AND newer.micro_batch = r.micro_batch AND newer.tp = r.tp)
""")


def downgrade() -> None:
    with op.batch_alter_table("profile_rows") as batch:
        batch.drop_constraint("uq_profile_rows_point", type_="unique")
        batch.add_column(sa.Column("uploaded", sa.Boolean, nullable=False,
                                   server_default=sa.true()))
    op.get_bind().execute(_COPY_CARRIED_ROWS, {"no": False})
