"""Per-category switches: switch_state.categories and switch_audit.category.

A category's own switch lives on the singleton row as a JSON object by category (empty:
every category follows the top level); an audit row names the category that moved.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine[Any]:
    # Frozen copy of canaryd.store.models.json_column_type: migrations must not change
    # when the models do.
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )


def upgrade() -> None:
    with op.batch_alter_table("switch_state") as batch:
        batch.add_column(sa.Column("categories", _json(), nullable=False, server_default="{}"))
    with op.batch_alter_table("switch_audit") as batch:
        batch.add_column(sa.Column("category", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("switch_audit") as batch:
        batch.drop_column("category")
    with op.batch_alter_table("switch_state") as batch:
        batch.drop_column("categories")
