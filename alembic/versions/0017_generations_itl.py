"""The gaps between a generation's output tokens: `generations.itl_*`.

A compact summary of `InterTokenLatency` per generation: the per-token gap quantiles
(P50, P95, P99) and the largest gap, the gaps summarised (`itl_tokens`) and the
deliveries after the first token (`itl_chunks`). Nullable: generations of fewer than two
tokens, engines that did not time them and rows stored before this revision have none.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_FLOATS = ("itl_p50_s", "itl_p95_s", "itl_p99_s", "itl_max_s")
_COUNTS = ("itl_tokens", "itl_chunks")


def upgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        for name in _FLOATS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
        for name in _COUNTS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        for name in (*_FLOATS, *_COUNTS):
            batch.drop_column(name)
