"""Teacher-scored argmax share of sampled pairs: `pair_scores.argmax_delta`.

The share of the speculative output's tokens that are the baseline (target) model's most
likely next token, minus the baseline output's share. Nullable: greedy pairs, remote
arms whose server reads no prompt log-probs, and pairs stored before this revision have
none.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.add_column(sa.Column("argmax_delta", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.drop_column("argmax_delta")
