"""Production telemetry: `telemetry_intervals`.

One row per arm and scrape interval: what the arm's serving engines or gateway counted
between two scrapes (requests, errors, speculative-decoding counters, load gauges, and
the latency histograms' bucket increases as JSON), keyed by the arms configuration it was
measured under. The telemetry gates read a window of them; retention deletes old ones.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )


def upgrade() -> None:
    op.create_table(
        "telemetry_intervals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("arm", sa.String(32), nullable=False),
        sa.Column("arms", sa.String(64), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("failed_replicas", sa.Integer(), nullable=False),
        sa.Column("restarted_replicas", sa.Integer(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=True),
        sa.Column("errors", sa.BigInteger(), nullable=True),
        sa.Column("drafts", sa.BigInteger(), nullable=True),
        sa.Column("draft_tokens", sa.BigInteger(), nullable=True),
        sa.Column("accepted_tokens", sa.BigInteger(), nullable=True),
        sa.Column("running", sa.Double(), nullable=True),
        sa.Column("waiting", sa.Double(), nullable=True),
        sa.Column("reported_acceptance_length", sa.Double(), nullable=True),
        sa.Column("reported_acceptance_rate", sa.Double(), nullable=True),
        sa.Column("e2e", _json(), nullable=True),
        sa.Column("ttft", _json(), nullable=True),
        sa.Column("itl", _json(), nullable=True),
        sa.CheckConstraint("end_at > start_at", name="ck_telemetry_intervals_interval"),
        sa.CheckConstraint(
            "replicas >= 0 AND failed_replicas >= 0", name="ck_telemetry_intervals_replicas"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_telemetry_intervals"),
    )
    op.create_index("ix_telemetry_intervals_arm_end_at", "telemetry_intervals", ["arm", "end_at"])
    op.create_index("ix_telemetry_intervals_end_at", "telemetry_intervals", ["end_at"])


def downgrade() -> None:
    op.drop_index("ix_telemetry_intervals_end_at", table_name="telemetry_intervals")
    op.drop_index("ix_telemetry_intervals_arm_end_at", table_name="telemetry_intervals")
    op.drop_table("telemetry_intervals")
