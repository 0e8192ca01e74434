"""A revision's latched FAIL, its operator's restore and its last traffic increase:
`revisions.failed_at`, `.failure`, `.restored_at`, `.restore`, `.increased_at`.

Once an enforce gate FAILs a revision, or the switch rolls speculation back while the
revision is judged, every later verdict of it is FAIL with that reason and time, until
an operator's restore clears it (`restored_at`, `restore`: who and why; the revision's
evidence restarts there) or the arm's next revision opens. `increased_at` is the last
traffic increase a rollout tool was told yes to: the next one needs evidence measured
after it. Nullable: windows opened before this revision have none of them.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_TIMES = ("failed_at", "restored_at", "increased_at")
_TEXTS = ("failure", "restore")


def upgrade() -> None:
    with op.batch_alter_table("revisions") as batch:
        for name in _TIMES:
            batch.add_column(sa.Column(name, sa.DateTime(timezone=True), nullable=True))
        for name in _TEXTS:
            batch.add_column(sa.Column(name, sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("revisions") as batch:
        for name in (*_TIMES, *_TEXTS):
            batch.drop_column(name)
