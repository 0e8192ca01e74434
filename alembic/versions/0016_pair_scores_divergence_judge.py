"""How a greedy divergence was judged: `pair_scores.divergence_judge`.

"forced" (the speculative output teacher-forced through the baseline, every token
judged), "first" (the first divergent token only, from the baseline's own top
log-probs), "bound" (the same with the speculative token unlisted: `divergence_margin`
is a lower bound, never a tie). Nullable: exact matches, unjudged divergences and pairs
stored before this revision (whose margin judged the first divergent token) have none.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.add_column(sa.Column("divergence_judge", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pair_scores") as batch:
        batch.drop_column("divergence_judge")
