"""The 4xx answers of a telemetry interval: `telemetry_intervals.client_errors`.

Of an interval's requests, those answered 4xx, where the arm's source reports status
codes (a gateway); `telemetry.errors` judges their excess over the baseline's as it
judges errors. Nullable: sources without status codes and rows stored before this
revision have none.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("telemetry_intervals") as batch:
        batch.add_column(sa.Column("client_errors", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("telemetry_intervals") as batch:
        batch.drop_column("client_errors")
