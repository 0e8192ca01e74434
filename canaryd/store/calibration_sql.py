"""The calibrated tie margins in SQL: `SqlCalibrationStore`, the `CalibrationStore` part of
`SqlStore` (joined by multiple inheritance over `SqlDatabase`, as the switch and
telemetry halves are).

This module owns the `tie_margins` rows: one per arms key (`canaryd.config.arms.arm_key`),
a `TieMargin` field for field. Saving replaces the key's row in one transaction (the
latest calibration is the one that holds); reading is by key only, so a margin measured
under another arms configuration is never read as this one's.
"""

from __future__ import annotations

from dataclasses import asdict, fields

from sqlalchemy import delete, select

from canaryd.store.abc import TieMargin
from canaryd.store.columns import aware
from canaryd.store.models import TieMarginRow
from canaryd.store.sql_base import SqlDatabase

__all__ = ["SqlCalibrationStore"]


class SqlCalibrationStore(SqlDatabase):
    """`CalibrationStore` on SQLAlchemy."""

    def tie_margin(self, arms: str) -> TieMargin | None:
        """The tie margin calibrated under the arms key `arms`; None when none was."""
        query = select(TieMarginRow).where(TieMarginRow.arms == arms)
        with self._translating("reading the calibrated tie margin"), self._sessions() as session:
            row = session.scalars(query).one_or_none()
            if row is None:
                return None
            return TieMargin(**{f.name: getattr(row, f.name) for f in fields(TieMargin)})

    def save_tie_margin(self, margin: TieMargin) -> None:
        """Store `margin` under its arms key, replacing the key's earlier calibration."""
        aware(margin.calibrated_at, "calibration time")
        if not margin.margin >= 0.0:
            raise ValueError(f"a tie margin must be a non-negative number, got {margin.margin!r}")
        with self._transaction("saving the calibrated tie margin") as session:
            session.execute(delete(TieMarginRow).where(TieMarginRow.arms == margin.arms))
            session.add(TieMarginRow(**asdict(margin)))
