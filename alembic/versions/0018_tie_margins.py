"""The tie margin calibrated on the deployment: `tie_margins`.

One row per arms key (`canaryd.config.arms.arm_key`): the margin `canaryd calibrate`
measured (a tail bound on healthy divergences' margins), the divergences and pairs it
rests on, the bound's coverage and confidence, and when. The quality gate uses it in
place of `gates.quality.tie_margin_nats` while the arms are configured as they were.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tie_margins",
        sa.Column("arms", sa.String(64), nullable=False),
        sa.Column("arm", sa.String(32), nullable=False),
        sa.Column("margin", sa.Double(), nullable=False),
        sa.Column("divergences", sa.Integer(), nullable=False),
        sa.Column("aa", sa.Integer(), nullable=False),
        sa.Column("ab", sa.Integer(), nullable=False),
        sa.Column("unmeasured", sa.Integer(), nullable=False),
        sa.Column("pairs", sa.Integer(), nullable=False),
        sa.Column("coverage", sa.Double(), nullable=False),
        sa.Column("confidence", sa.Double(), nullable=False),
        sa.Column("calibrated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("margin >= 0", name="ck_tie_margins_margin"),
        sa.PrimaryKeyConstraint("arms", name="pk_tie_margins"),
    )


def downgrade() -> None:
    op.drop_table("tie_margins")
