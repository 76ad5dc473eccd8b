"""Alembic environment: migrations run on the connection `api.storage.db.migrate` passes."""

from __future__ import annotations

from alembic import context

from api.storage.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only `migrate()` runs these migrations
    raise RuntimeError("run migrations through api.storage.db.migrate(engine)")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
