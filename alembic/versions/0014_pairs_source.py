"""Live traffic: `pairs.source`.

A pair's prompt came from a suite (`control`) or from a production request mirrored to
canaryd's sink (`live`); existing rows are suite pairs. Indexed with `started_at`, as a
window of one source is read on its own.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pairs") as batch:
        batch.add_column(
            sa.Column("source", sa.String(16), nullable=False, server_default="control")
        )
        batch.create_index("ix_pairs_source_started_at", ["source", "started_at"])


def downgrade() -> None:
    # In place, never by recreating `pairs` (other tables refer to it; SQLite copies a
    # table to change it).
    op.drop_index("ix_pairs_source_started_at", table_name="pairs")
    op.drop_column("pairs", "source")
