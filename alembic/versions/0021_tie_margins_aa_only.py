"""The tie margin from A/A pairs alone, and the engines it was measured on:
`tie_margins.aa_arm`, `.aa_divergent_pairs`, `.engines`.

`canaryd calibrate` now bounds one margin per divergent pair of the baseline against
itself or the A/A control arm (`aa_arm`, `aa_divergent_pairs` of them), never the arm
under test's divergences, and keeps the key of the engines it measured (`engines`:
their identities and, in process, the torch and transformers versions). The quality
gate uses a margin only while the pairs it judges come from those engines and for
`gates.quality.tie_margin_max_age_days` after `calibrated_at`. Nullable: rows stored
before this revision were bounded on A/A and A/B tokens pooled, and no longer judge.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tie_margins") as batch:
        batch.add_column(sa.Column("aa_arm", sa.String(32), nullable=True))
        batch.add_column(sa.Column("aa_divergent_pairs", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("engines", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tie_margins") as batch:
        for name in ("engines", "aa_divergent_pairs", "aa_arm"):
            batch.drop_column(name)
