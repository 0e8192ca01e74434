"""The switch's tables in SQLAlchemy Core: the switch row, its audit trail, gate
decisions, pinned drift references and revision windows.

Declared on the schema's one `metadata` (`canaryd.store.model_types`), which the history's
ORM models share, so Alembic and the migration test see one schema; but as Core `Table`s,
so that `canaryd switch` queries them on a `Connection` without importing the ORM.
`canaryd.store.models` maps its `SwitchStateRow` … `RevisionRow` onto these tables.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    String,
    Table,
    Text,
)

from canaryd.store.model_types import UTCDateTime, json_column_type, metadata

__all__ = ["drift_references", "gate_decisions", "revisions", "switch_audit", "switch_state"]

# The rollback switch: one row (id 1), authoritative; the state file mirrors it.
#
# Every change happens under a row lock (PostgreSQL `SELECT … FOR UPDATE`, SQLite
# `BEGIN IMMEDIATE`), and `generation` only grows. `applied_generation` is the last
# generation whose state file and hooks all succeeded; below `generation`, the daemon
# re-applies. `recent_trips` is a JSON list of ISO times of automatic trips (latch);
# `categories` a JSON object of the per-category switches by category.
# `gates_completed_at` is when the leader's last gate run completed (the state file's
# `confirmed_at` never claims more).
switch_state = Table(
    "switch_state",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("mode", String(16), nullable=False),
    Column("control", String(16), nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("since", UTCDateTime(), nullable=True),
    Column("actor", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    Column("latched", Boolean, nullable=False),
    Column("cooldown_until", UTCDateTime(), nullable=True),
    Column("recent_trips", json_column_type(), nullable=False),
    Column("categories", json_column_type(), nullable=False, server_default="{}"),
    Column("applied_generation", BigInteger, nullable=True),
    Column("actuator_errors", json_column_type(), nullable=True),
    Column("actuated_at", UTCDateTime(), nullable=True),
    Column("gates_completed_at", UTCDateTime(), nullable=True),
    CheckConstraint("id = 1", name="singleton"),
    CheckConstraint("mode IN ('auto', 'rolled_back')", name="mode"),
    CheckConstraint("control IN ('gates', 'manual')", name="control"),
    CheckConstraint("generation >= 0", name="generation"),
)

# One switch transition (`kind` transition) or a refused human command (`refused`): who
# (`gate:<name>` or `user:<name>`), why, and the gate evidence as JSON. `category` names
# the category that moved (None: the top level).
switch_audit = Table(
    "switch_audit",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("at", UTCDateTime(), nullable=False, index=True),
    Column("kind", String(16), nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("previous", String(16), nullable=False),
    Column("target", String(16), nullable=False),
    Column("control", String(16), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    Column("evidence", json_column_type(), nullable=False),
    Column("category", String(100), nullable=True),
    CheckConstraint("kind IN ('transition', 'refused')", name="kind"),
)

# One gate's decision in one evaluation; the rows sharing `evaluated_at` and
# `comparison_arm` are one `gates.Evaluation`. `decision` is `GateDecision.to_dict()`,
# evidence and components. `comparison_arm` is NULL for the evaluations of the switch's
# arm (the ones the switch steps on), else the comparison arm judged (never switching).
gate_decisions = Table(
    "gate_decisions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("evaluated_at", UTCDateTime(), nullable=False, index=True),
    Column("gate", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("mode", String(16), nullable=False),
    Column("critical", Boolean, nullable=False),
    Column("decision", json_column_type(), nullable=False),
    Column("comparison_arm", String(32), nullable=True),
    Index(None, "gate", "evaluated_at"),
)

# A category's pinned healthy acceptance length (`gates.ReferenceStats`).
drift_references = Table(
    "drift_references",
    metadata,
    # The arms configuration the reference was measured under
    # (canaryd.config.arms.arms_key); "" for references pinned before they were keyed.
    Column("arms", String(64), primary_key=True),
    Column("category", String(100), primary_key=True),
    Column("mean", Double, nullable=False),
    Column("sd", Double, nullable=False),
    Column("n", Integer, nullable=False),
    # Mean and sd of log(acceptance length); NULL for references pinned before them.
    Column("log_mean", Double, nullable=True),
    Column("log_sd", Double, nullable=True),
    Column("pinned_at", UTCDateTime(), nullable=False),
)

# When the evidence window of one revision of a speculative arm started: the first
# verdict request that named it. The arm's next revision's start ends it. `failed_at` and
# `failure`: the revision's latched FAIL, when and why (NULL: none stands); `restored_at`
# and `restore`: an operator's last restore, which cleared it and restarts the revision's
# evidence (who and why); `increased_at`: the last traffic increase a rollout tool was
# told yes to (Flagger's confirm-traffic-increase).
revisions = Table(
    "revisions",
    metadata,
    Column("arm", String(32), primary_key=True),
    Column("revision", String(128), primary_key=True),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("failed_at", UTCDateTime(), nullable=True),
    Column("failure", Text, nullable=True),
    Column("restored_at", UTCDateTime(), nullable=True),
    Column("restore", Text, nullable=True),
    Column("increased_at", UTCDateTime(), nullable=True),
    Index(None, "arm", "started_at"),
)
