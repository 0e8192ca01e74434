"""canaryd's history in SQL: the store protocols (`abc`), `SqlStore` (`sql`), database
URLs and engines (`database`), schema migrations (`migrations`), the mapping between
records and rows (`mapping`), and the per-hour roll-ups that retention keeps after raw
pairs are deleted (`rollup`)."""

from __future__ import annotations

from canaryd.store.abc import (
    RETENTION_BATCH_PAIRS,
    History,
    HistoryStore,
    RetentionReport,
    Store,
    StoredRun,
    SwitchStore,
)
from canaryd.store.database import EXPECTED_URL_FORMS, mask_url
from canaryd.store.migrations import (
    current_revision,
    head_revision,
    known_revisions,
    schema_problem,
    upgrade,
)
from canaryd.store.rollup import PairFacts, PairRollup
from canaryd.store.sql import SqlStore
from canaryd.store.switching import AuditEntry, RevisionWindow, SwitchRecord, decision_from_dict

__all__ = [
    "EXPECTED_URL_FORMS",
    "RETENTION_BATCH_PAIRS",
    "AuditEntry",
    "History",
    "HistoryStore",
    "PairFacts",
    "PairRollup",
    "RetentionReport",
    "RevisionWindow",
    "SqlStore",
    "Store",
    "StoredRun",
    "SwitchRecord",
    "SwitchStore",
    "current_revision",
    "decision_from_dict",
    "head_revision",
    "known_revisions",
    "mask_url",
    "schema_problem",
    "upgrade",
]
