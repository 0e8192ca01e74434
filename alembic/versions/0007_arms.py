"""Named arms: several speculative arms per run.

A pair row names its speculative arm (`pairs.arm`, existing rows "speculative") and the
group of rows one prompt became (`pairs.group_id`, existing rows their own pair id);
roll-ups are kept per arm as well (unique per hour, category and arm); a run records
every speculative arm's identity (`runs.arm_identities`); a gate decision names the
comparison arm it judged (`gate_decisions.comparison_arm`, NULL: the switch's arm); a
generation keeps the drafting and verifying time its engine measured (`generations.
draft_s`, `verify_s`, `tree_tokens`; NULL when not measured).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine[Any]:
    # Frozen copy of canaryd.store.models.json_column_type: migrations must not change
    # when the models do.
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )


# Tables other tables refer to (runs, pairs) are never recreated: SQLite copies a table to
# change it, and dropping the original breaks the foreign keys of the rows referring to it.
# Columns are only added (with their defaults) and, going down, dropped in place.


def upgrade() -> None:
    with op.batch_alter_table("pairs") as batch:
        batch.add_column(
            sa.Column("arm", sa.String(32), nullable=False, server_default="speculative")
        )
        batch.add_column(sa.Column("group_id", sa.String(64), nullable=False, server_default=""))
        batch.create_index("ix_pairs_arm_started_at", ["arm", "started_at"])
    op.execute("UPDATE pairs SET group_id = pair_id")
    with op.batch_alter_table("pair_rollups", recreate="always") as batch:
        batch.add_column(
            sa.Column("arm", sa.String(32), nullable=False, server_default="speculative")
        )
        batch.drop_constraint("uq_pair_rollups_hour_start_category", type_="unique")
        batch.create_unique_constraint(
            "uq_pair_rollups_hour_start_category_arm", ["hour_start", "category", "arm"]
        )
    with op.batch_alter_table("generations") as batch:
        batch.add_column(sa.Column("draft_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("verify_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("tree_tokens", sa.Integer(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("arm_identities", _json(), nullable=False, server_default="{}"))
    with op.batch_alter_table("gate_decisions") as batch:
        batch.add_column(sa.Column("comparison_arm", sa.String(32), nullable=True))


def downgrade() -> None:
    # Comparison arms' rows have no place in the older schema: only the arm called
    # "speculative" (the one arm of older configurations) and the switch's decisions stay.
    op.execute("DELETE FROM gate_decisions WHERE comparison_arm IS NOT NULL")
    op.drop_column("gate_decisions", "comparison_arm")
    op.drop_column("runs", "arm_identities")
    for column in ("tree_tokens", "verify_s", "draft_s"):
        op.drop_column("generations", column)
    op.execute("DELETE FROM pair_rollups WHERE arm <> 'speculative'")
    with op.batch_alter_table("pair_rollups", recreate="always") as batch:
        batch.drop_constraint("uq_pair_rollups_hour_start_category_arm", type_="unique")
        batch.create_unique_constraint(
            "uq_pair_rollups_hour_start_category", ["hour_start", "category"]
        )
        batch.drop_column("arm")
    for table in ("pair_scores", "generations"):
        op.execute(
            f"DELETE FROM {table} WHERE pair_id IN "  # noqa: S608  (fixed table names)
            "(SELECT pair_id FROM pairs WHERE arm <> 'speculative')"
        )
    op.execute("DELETE FROM pairs WHERE arm <> 'speculative'")
    op.drop_index("ix_pairs_arm_started_at", table_name="pairs")
    op.drop_column("pairs", "group_id")
    op.drop_column("pairs", "arm")
