"""canaryd's history in SQL: the `Store` protocol, `SqlStore`, and schema migrations."""

from __future__ import annotations

from canaryd.store.sql import (
    EXPECTED_URL_FORMS,
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

__all__ = [
    "EXPECTED_URL_FORMS",
    "SqlStore",
    "Store",
    "StoredRun",
    "current_revision",
    "head_revision",
    "known_revisions",
    "mask_url",
    "resolve_database_url",
    "schema_problem",
    "upgrade",
]
