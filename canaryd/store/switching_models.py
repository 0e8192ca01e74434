"""The switch's tables as SQLAlchemy models: the switch row, its audit trail, gate
decisions, pinned drift references and revision windows.

Declared on the history's `Base` (`canaryd.store.model_types`), so one metadata holds the
whole schema, but in a module of their own, so that `canaryd switch` maps these five
tables and not the history's; `canaryd.store.models` re-exports them with the rest.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, CheckConstraint, Double, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from canaryd.store.model_types import Base, UTCDateTime, json_column_type

__all__ = [
    "DriftReferenceRow",
    "GateDecisionRow",
    "RevisionRow",
    "SwitchAuditRow",
    "SwitchStateRow",
]


class SwitchStateRow(Base):
    """The rollback switch: one row (id 1), authoritative; the state file mirrors it.

    Every change happens under a row lock (PostgreSQL `SELECT … FOR UPDATE`, SQLite
    `BEGIN IMMEDIATE`), and `generation` only grows. `applied_generation` is the last
    generation whose state file and hooks all succeeded; below `generation`, the daemon
    re-applies. `recent_trips` is a JSON list of ISO times of automatic trips (latch);
    `categories` a JSON object of the per-category switches by category.
    `gates_completed_at` is when the leader's last gate run completed (the state file's
    `confirmed_at` never claims more).
    """

    __tablename__ = "switch_state"
    __table_args__ = (
        CheckConstraint("id = 1", name="singleton"),
        CheckConstraint("mode IN ('auto', 'rolled_back')", name="mode"),
        CheckConstraint("control IN ('gates', 'manual')", name="control"),
        CheckConstraint("generation >= 0", name="generation"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    mode: Mapped[str] = mapped_column(String(16))
    control: Mapped[str] = mapped_column(String(16))
    generation: Mapped[int] = mapped_column(BigInteger)
    since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    latched: Mapped[bool] = mapped_column(Boolean)
    cooldown_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    recent_trips: Mapped[list[str]] = mapped_column(json_column_type())
    categories: Mapped[dict[str, Any]] = mapped_column(json_column_type(), server_default="{}")
    applied_generation: Mapped[int | None] = mapped_column(BigInteger)
    actuator_errors: Mapped[dict[str, str] | None] = mapped_column(json_column_type())
    actuated_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    gates_completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class SwitchAuditRow(Base):
    """One switch transition (`kind` transition) or a refused human command (`refused`):
    who (`gate:<name>` or `user:<name>`), why, and the gate evidence as JSON. `category`
    names the category that moved (None: the top level)."""

    __tablename__ = "switch_audit"
    __table_args__ = (CheckConstraint("kind IN ('transition', 'refused')", name="kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    generation: Mapped[int] = mapped_column(BigInteger)
    previous: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(16))
    control: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(json_column_type())
    category: Mapped[str | None] = mapped_column(String(100))


class GateDecisionRow(Base):
    """One gate's decision in one evaluation; the rows sharing `evaluated_at` and
    `comparison_arm` are one `gates.Evaluation`. `decision` is `GateDecision.to_dict()`,
    evidence and components. `comparison_arm` is NULL for the evaluations of the switch's
    arm (the ones the switch steps on), else the comparison arm judged (never switching)."""

    __tablename__ = "gate_decisions"
    __table_args__ = (Index(None, "gate", "evaluated_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    evaluated_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    gate: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    critical: Mapped[bool] = mapped_column(Boolean)
    decision: Mapped[dict[str, Any]] = mapped_column(json_column_type())
    comparison_arm: Mapped[str | None] = mapped_column(String(32))


class DriftReferenceRow(Base):
    """A category's pinned healthy acceptance length (`gates.ReferenceStats`)."""

    __tablename__ = "drift_references"

    # The arms configuration the reference was measured under (gating.arms_key); ""
    # for references pinned before references were keyed.
    arms: Mapped[str] = mapped_column(String(64), primary_key=True)
    category: Mapped[str] = mapped_column(String(100), primary_key=True)
    mean: Mapped[float] = mapped_column(Double)
    sd: Mapped[float] = mapped_column(Double)
    n: Mapped[int] = mapped_column(Integer)
    # Mean and sd of log(acceptance length); NULL for references pinned before them.
    log_mean: Mapped[float | None] = mapped_column(Double, nullable=True)
    log_sd: Mapped[float | None] = mapped_column(Double, nullable=True)
    pinned_at: Mapped[datetime] = mapped_column(UTCDateTime())


class RevisionRow(Base):
    """When the evidence window of one revision of a speculative arm started: the first
    verdict request that named it. The arm's next revision's start ends it."""

    __tablename__ = "revisions"
    __table_args__ = (Index(None, "arm", "started_at"),)

    arm: Mapped[str] = mapped_column(String(32), primary_key=True)
    revision: Mapped[str] = mapped_column(String(128), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
