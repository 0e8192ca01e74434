"""Per-hour, per-category roll-ups of pairs that retention has removed: pair_rollups.

Revision ID: 0002
Revises: 0001
Create Date: 2025-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    # Frozen copy of canaryd.store.models.json_column_type: migrations must not change
    # when the models do.
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )


def upgrade() -> None:
    op.create_table(
        "pair_rollups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hour_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("category", sa.String(100), nullable=False),
        sa.Column("pairs", sa.Integer(), nullable=False),
        sa.Column("complete_pairs", sa.Integer(), nullable=False),
        sa.Column("scored_pairs", sa.Integer(), nullable=False),
        sa.Column("exact_matches", sa.Integer(), nullable=False),
        sa.Column("quality_delta_count", sa.Integer(), nullable=False),
        sa.Column("quality_delta_sum", sa.Double(), nullable=False),
        sa.Column("speedup_count", sa.Integer(), nullable=False),
        sa.Column("speedup_sum", sa.Double(), nullable=False),
        sa.Column("speedup_histogram", _json(), nullable=False),
        sa.Column("baseline_ok", sa.Integer(), nullable=False),
        sa.Column("baseline_errors", _json(), nullable=False),
        sa.Column("baseline_output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("baseline_e2e_sum_s", sa.Double(), nullable=False),
        sa.Column("baseline_e2e_histogram", _json(), nullable=False),
        sa.Column("baseline_ttft_count", sa.Integer(), nullable=False),
        sa.Column("baseline_ttft_sum_s", sa.Double(), nullable=False),
        sa.Column("baseline_ttft_histogram", _json(), nullable=False),
        sa.Column("baseline_tpot_count", sa.Integer(), nullable=False),
        sa.Column("baseline_tpot_sum_s", sa.Double(), nullable=False),
        sa.Column("baseline_tpot_histogram", _json(), nullable=False),
        sa.Column("speculative_ok", sa.Integer(), nullable=False),
        sa.Column("speculative_errors", _json(), nullable=False),
        sa.Column("speculative_output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("speculative_e2e_sum_s", sa.Double(), nullable=False),
        sa.Column("speculative_e2e_histogram", _json(), nullable=False),
        sa.Column("speculative_ttft_count", sa.Integer(), nullable=False),
        sa.Column("speculative_ttft_sum_s", sa.Double(), nullable=False),
        sa.Column("speculative_ttft_histogram", _json(), nullable=False),
        sa.Column("speculative_tpot_count", sa.Integer(), nullable=False),
        sa.Column("speculative_tpot_sum_s", sa.Double(), nullable=False),
        sa.Column("speculative_tpot_histogram", _json(), nullable=False),
        sa.Column("speculative_reported", sa.Integer(), nullable=False),
        sa.Column("verify_steps", sa.BigInteger(), nullable=False),
        sa.Column("draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted_per_position", _json(), nullable=False),
        sa.Column("drafted_per_position", _json(), nullable=False),
        sa.Column("acceptance_length_count", sa.Integer(), nullable=False),
        sa.Column("acceptance_length_sum", sa.Double(), nullable=False),
        sa.Column("acceptance_length_histogram", _json(), nullable=False),
        sa.CheckConstraint(
            "complete_pairs >= 0 AND complete_pairs <= pairs",
            name="ck_pair_rollups_pair_counts",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_pair_rollups"),
        sa.UniqueConstraint("hour_start", "category", name="uq_pair_rollups_hour_start_category"),
    )


def downgrade() -> None:
    op.drop_table("pair_rollups")
