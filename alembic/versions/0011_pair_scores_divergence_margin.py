"""Numeric ties of greedy pairs: `pair_scores.divergence_margin`.

At the first token where a greedy pair's outputs differ, the baseline (target) model's
log-probability of the baseline's token minus that of the speculative arm's (nats). The
quality gate counts a divergence within `gates.quality.tie_margin_nats` as a numeric tie
(bf16 kernels picking between near-equal logits), not as a mismatch. Nullable: equal
outputs, arms whose server reads no prompt log-probs, and pairs stored before this
revision have none.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.add_column(sa.Column("divergence_margin", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.drop_column("divergence_margin")
