"""The rollback switch and the gates' record: switch_state, switch_audit, gate_decisions,
drift_references.

Revision ID: 0003
Revises: 0002
Create Date: 2025-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
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
        "switch_state",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("control", sa.String(16), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("latched", sa.Boolean(), nullable=False),
        sa.Column("cooldown_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("recent_trips", _json(), nullable=False),
        sa.Column("applied_generation", sa.BigInteger(), nullable=True),
        sa.Column("actuator_errors", _json(), nullable=True),
        sa.Column("actuated_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name="ck_switch_state_singleton"),
        sa.CheckConstraint("mode IN ('auto', 'rolled_back')", name="ck_switch_state_mode"),
        sa.CheckConstraint("control IN ('gates', 'manual')", name="ck_switch_state_control"),
        sa.CheckConstraint("generation >= 0", name="ck_switch_state_generation"),
        sa.PrimaryKeyConstraint("id", name="pk_switch_state"),
    )
    op.create_table(
        "switch_audit",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("previous", sa.String(16), nullable=False),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("control", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", _json(), nullable=False),
        sa.CheckConstraint("kind IN ('transition', 'refused')", name="ck_switch_audit_kind"),
        sa.PrimaryKeyConstraint("id", name="pk_switch_audit"),
    )
    op.create_index("ix_switch_audit_at", "switch_audit", ["at"])
    op.create_table(
        "gate_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("evaluated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gate", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("critical", sa.Boolean(), nullable=False),
        sa.Column("decision", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_gate_decisions"),
    )
    op.create_index("ix_gate_decisions_evaluated_at", "gate_decisions", ["evaluated_at"])
    op.create_index(
        "ix_gate_decisions_gate_evaluated_at", "gate_decisions", ["gate", "evaluated_at"]
    )
    op.create_table(
        "drift_references",
        sa.Column("category", sa.String(100), nullable=False),
        sa.Column("mean", sa.Double(), nullable=False),
        sa.Column("sd", sa.Double(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("category", name="pk_drift_references"),
    )


def downgrade() -> None:
    op.drop_table("drift_references")
    op.drop_index("ix_gate_decisions_gate_evaluated_at", table_name="gate_decisions")
    op.drop_index("ix_gate_decisions_evaluated_at", table_name="gate_decisions")
    op.drop_table("gate_decisions")
    op.drop_index("ix_switch_audit_at", table_name="switch_audit")
    op.drop_table("switch_audit")
    op.drop_table("switch_state")
