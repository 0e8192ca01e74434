"""canaryd's history in SQL: the store protocols (`abc`), `SqlStore` (`sql`) with its
switch half (`switching_sql`), its telemetry part (`telemetry_sql`: the arms' scrape
intervals), its calibrated tie margins (`calibration_sql`) and the database plumbing all
share (`sql_base`), database URLs and engines (`database`), schema migrations
(`migrations`), the ORM models (`models`; the switch's tables, in Core, in
`switching_tables`; the metadata and column types in `model_types`), the mapping between
records and rows (`columns`, `mapping`, `switching_mapping`), the switch's records
(`switching`), the per-hour roll-ups that retention keeps after raw pairs are deleted
(`rollup`), the bounded read of recent generations' ITL and fallback counts
(`serving`), and the text every backend can store (`text`).
The names below are imported on first use (PEP 562), each from the module its
TYPE_CHECKING import names (`engine.lazy`): a command that needs the database URL's
helpers or the switch's records does not import the ORM models or Alembic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_exports

if TYPE_CHECKING:
    from canaryd.store.abc import (
        RETENTION_BATCH_PAIRS,
        CalibrationStore,
        History,
        HistoryStore,
        RetentionReport,
        Store,
        StoredInterval,
        StoredRun,
        SwitchStore,
        TelemetryStore,
        TieMargin,
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
    from canaryd.store.sql import SqlHistoryStore, SqlStore
    from canaryd.store.switching import AuditEntry, RevisionWindow, SwitchRecord, decision_from_dict
    from canaryd.store.switching_sql import SqlSwitchStore

__getattr__, __dir__ = lazy_exports(globals())


__all__ = [
    "EXPECTED_URL_FORMS",
    "RETENTION_BATCH_PAIRS",
    "AuditEntry",
    "CalibrationStore",
    "History",
    "HistoryStore",
    "PairFacts",
    "PairRollup",
    "RetentionReport",
    "RevisionWindow",
    "SqlHistoryStore",
    "SqlStore",
    "SqlSwitchStore",
    "Store",
    "StoredInterval",
    "StoredRun",
    "SwitchRecord",
    "SwitchStore",
    "TelemetryStore",
    "TieMargin",
    "current_revision",
    "decision_from_dict",
    "head_revision",
    "known_revisions",
    "mask_url",
    "schema_problem",
    "upgrade",
]
