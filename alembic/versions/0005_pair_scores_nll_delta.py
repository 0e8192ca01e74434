"""Teacher-scored likelihood of sampled pairs: `pair_scores.nll_delta`.

The mean token NLL of the speculative output minus the baseline's, both under the
baseline (target) model. Nullable: greedy pairs, remote arms and pairs stored before
this revision have none.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.add_column(sa.Column("nll_delta", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.drop_column("nll_delta")
