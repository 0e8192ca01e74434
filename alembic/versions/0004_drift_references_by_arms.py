"""Drift references keyed by the arms configuration: (arms, category).

A new draft length or drafter moves every category's acceptance length; its references
are pinned anew instead of tripping the switch against the old ones. References pinned
before this revision keep arms = "" and match no configuration, so they are re-pinned.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("drift_references", recreate="always") as batch:
        batch.add_column(sa.Column("arms", sa.String(64), nullable=False, server_default=""))
        batch.drop_constraint("pk_drift_references", type_="primary")
        batch.create_primary_key("pk_drift_references", ["arms", "category"])


def downgrade() -> None:
    op.execute("DELETE FROM drift_references WHERE arms <> ''")
    with op.batch_alter_table("drift_references", recreate="always") as batch:
        batch.drop_constraint("pk_drift_references", type_="primary")
        batch.create_primary_key("pk_drift_references", ["category"])
        batch.drop_column("arms")
