"""Garbage under sampling: `pair_scores.baseline_max_nll` and `speculative_max_nll`.

For sampled pairs the baseline (target) model scored as teacher, the largest NLL of a
single token of each arm's output (nats). A token the model would all but never sample
(a random token scores 10 nats and more) is garbage: the quality gate's implausible-token
check (`quality.implausible`) counts the pairs where only the speculative output has one.
Nullable: greedy pairs, identical outputs, teachers that cannot say, and pairs stored
before this revision have none.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.add_column(sa.Column("baseline_max_nll", sa.Double(), nullable=True))
        batch.add_column(sa.Column("speculative_max_nll", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.drop_column("speculative_max_nll")
        batch.drop_column("baseline_max_nll")
