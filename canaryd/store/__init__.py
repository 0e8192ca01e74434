"""canaryd's history in SQL: the `Store` protocol, `SqlStore`, schema migrations, and the
per-hour roll-ups that retention keeps after raw pairs are deleted."""

from __future__ import annotations

from canaryd.store.rollup import PairFacts, PairRollup
from canaryd.store.sql import (
    EXPECTED_URL_FORMS,
    RETENTION_BATCH_PAIRS,
    History,
    RetentionReport,
    SqlStore,
    Store,
    StoredRun,
    current_revision,
    head_revision,
    known_revisions,
    mask_url,
    resolve_database_url,
    schema_problem,
    upgrade,
)
from canaryd.store.switching import AuditEntry, SwitchRecord, decision_from_dict

__all__ = [
    "EXPECTED_URL_FORMS",
    "RETENTION_BATCH_PAIRS",
    "AuditEntry",
    "History",
    "PairFacts",
    "PairRollup",
    "RetentionReport",
    "SqlStore",
    "Store",
    "StoredRun",
    "SwitchRecord",
    "current_revision",
    "decision_from_dict",
    "head_revision",
    "known_revisions",
    "mask_url",
    "resolve_database_url",
    "schema_problem",
    "upgrade",
]
