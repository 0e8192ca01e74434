"""Drift references keep the mean and sd of log(acceptance length) too.

A proportional drop of the acceptance length is a plain shift on the log scale, where the
drift gate's gross-drop chart runs. Nullable: references pinned before this revision
have none, and the gate falls back to its linear chart for them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("drift_references") as batch:
        batch.add_column(sa.Column("log_mean", sa.Double(), nullable=True))
        batch.add_column(sa.Column("log_sd", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drift_references") as batch:
        batch.drop_column("log_sd")
        batch.drop_column("log_mean")
