"""Which stored pairs are evidence: the window of an arm that a judgement reads.

Shared by the daemon's gate job and the verdict: `read_window` asks the store for the pairs
of the longest gate window (`gates.cycle.window_bounds`) up to a time, optionally cut to a
revision's window and one category, and `under_current_arms` keeps only the pairs measured
with the arms configured now.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog

from canaryd.config import Settings
from canaryd.pairs.plan import arm_pair_config
from canaryd.store import HistoryStore
from gates.cycle import window_bounds
from gates.records import PairRecord

__all__ = ["read_window", "under_current_arms"]

log = structlog.get_logger(__name__)


def under_current_arms(
    settings: Settings, store: HistoryStore, records: list[PairRecord], arm: str
) -> list[PairRecord]:
    """Only pairs of `arm` measured with the baseline and `arm` configured as in `settings`
    count as evidence.

    After a reload or restart that changed the arm or the baseline (a new draft model,
    another k), the old pairs say nothing about the new ones: a restore must not rest on
    them. Other arms added, changed or removed leave them standing. A run that recorded no
    arms configuration (not written by canaryd) is kept.
    """
    run_ids = {record.run_id for record in records}
    if not run_ids:
        return records
    current = arm_pair_config(settings.snapshot().get("arms"), arm)
    arms_of = {
        run_id: run.info.config.get("arms") for run_id, run in store.runs_by_id(run_ids).items()
    }
    kept = [
        r
        for r in records
        if arms_of.get(r.run_id) is None or arm_pair_config(arms_of[r.run_id], arm) == current
    ]
    if len(kept) < len(records):
        log.info(
            "gates.window_filtered",
            arm=arm,
            dropped=len(records) - len(kept),
            reason="pairs measured with a different arms configuration",
        )
    return kept


def read_window(
    store: HistoryStore,
    settings: Settings,
    arm: str,
    at: datetime,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    category: str | None = None,
) -> list[PairRecord]:
    """The pairs of `arm` in the longest gate window up to `at` (inclusive), from `start`
    and before `end` when given (a revision's window), of `category` when given, measured
    under the arms configured now."""
    seconds, limit = window_bounds(settings.gates)
    since = at - timedelta(seconds=seconds) if seconds is not None else None
    if start is not None:
        since = start if since is None else max(since, start)
    until = at + timedelta(microseconds=1)
    if end is not None:
        until = min(until, end)
    records = store.pairs(since=since, until=until, limit=limit, arm=arm, category=category)
    return under_current_arms(settings, store, records, arm)
