"""When the leader's last gate run completed: `switch_state.gates_completed_at`.

The state file's `confirmed_at` is refreshed only by a gate run that completed, and a
daemon that does not lead carries this time forward instead of its own clock, so a frozen
or failing leader lets every host's file age. Nullable: no run has completed yet.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("switch_state") as batch:
        batch.add_column(sa.Column("gates_completed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("switch_state") as batch:
        batch.drop_column("gates_completed_at")
