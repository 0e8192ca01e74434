"""Evidence windows per revision: `revisions`.

A revision is what a speculative arm serves (a pod-template hash, a Flagger checksum, a
git sha). The first verdict request naming a new revision starts its window; pairs of
the arm measured before that never judge it, and the next revision's start ends it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "revisions",
        sa.Column("arm", sa.String(32), nullable=False),
        sa.Column("revision", sa.String(128), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("arm", "revision", name="pk_revisions"),
    )
    op.create_index("ix_revisions_arm_started_at", "revisions", ["arm", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_revisions_arm_started_at", table_name="revisions")
    op.drop_table("revisions")
