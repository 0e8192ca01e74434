"""The arms' production telemetry in SQL: `SqlTelemetryStore`, the `TelemetryStore` part of
`SqlStore` (joined by multiple inheritance over `SqlDatabase`, as the switch half is).

This module owns the `telemetry_intervals` rows: writing a scrape's intervals (one row per
arm) in one transaction, reading an arm's intervals of a time window measured under one
arms configuration, oldest first, and deleting the old ones. A `StoredInterval` maps to a
row field for field; a latency histogram's bucket increases are JSON,
`{"le": [upper bounds], "count": [cumulative counts]}`, with an infinite bound written as
`"+Inf"` (JSON has no infinity; PostgreSQL's JSONB refuses one). The interval's replica
count is the row's (`StoredInterval.replicas`). Those histograms are the only part of a row
whose size an endpoint sets: an interval whose histograms take more than
`MAX_INTERVAL_BYTES` of JSON is refused (ValueError). The scrape never makes one: it refuses
a histogram of more than `telemetry.max_buckets` bounds (at most 256), and three of those
take under 40 KB.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from canaryd.store.abc import StoredInterval
from canaryd.store.columns import aware
from canaryd.store.models import TelemetryIntervalRow
from canaryd.store.sql_base import SqlDatabase
from gates.stats.histogram import BucketCounts
from gates.telemetry.intervals import TelemetryInterval

__all__ = [
    "MAX_INTERVAL_BYTES",
    "SqlTelemetryStore",
    "buckets_from_json",
    "buckets_json",
    "interval_json_bytes",
]

MAX_INTERVAL_BYTES = 64 * 1024

_INFINITE = {"+Inf": math.inf, "-Inf": -math.inf}
_COUNTS = ("requests", "errors", "client_errors", "drafts", "draft_tokens", "accepted_tokens")
_GAUGES = ("running", "waiting", "reported_acceptance_length", "reported_acceptance_rate")
_HISTOGRAMS = ("e2e", "ttft", "itl")


def buckets_json(buckets: BucketCounts | None) -> dict[str, Any] | None:
    """A histogram's increase as its JSON column holds it."""
    if buckets is None:
        return None
    bounds: list[float | str] = [
        bound if math.isfinite(bound) else ("+Inf" if bound > 0 else "-Inf")
        for bound in buckets.bounds
    ]
    return {"le": bounds, "count": list(buckets.cumulative)}


def buckets_from_json(value: dict[str, Any] | None) -> BucketCounts | None:
    """The histogram increase a JSON column holds (None for SQL NULL)."""
    if value is None:
        return None
    bounds = tuple(
        _INFINITE[bound] if isinstance(bound, str) else float(bound) for bound in value["le"]
    )
    return BucketCounts(bounds, tuple(float(count) for count in value["count"]))


def interval_json_bytes(interval: TelemetryInterval) -> int:
    """The bytes of JSON an interval's histograms take in its row."""
    return sum(
        len(json.dumps(buckets_json(getattr(interval, name))).encode()) for name in _HISTOGRAMS
    )


def interval_row(stored: StoredInterval) -> TelemetryIntervalRow:
    interval = stored.interval
    aware(interval.start, "telemetry interval start")
    aware(interval.end, "telemetry interval end")
    size = interval_json_bytes(interval)
    if size > MAX_INTERVAL_BYTES:
        raise ValueError(
            f"a telemetry interval of {stored.arm!r} with {size} bytes of histograms, over "
            f"{MAX_INTERVAL_BYTES}: the scrape should have refused it (telemetry.max_buckets)"
        )
    values: dict[str, Any] = {name: getattr(interval, name) for name in (*_COUNTS, *_GAUGES)}
    values.update({name: buckets_json(getattr(interval, name)) for name in _HISTOGRAMS})
    return TelemetryIntervalRow(
        arm=stored.arm,
        arms=stored.arms,
        start_at=interval.start,
        end_at=interval.end,
        replicas=stored.replicas,
        failed_replicas=stored.failed_replicas,
        restarted_replicas=stored.restarted_replicas,
        **values,
    )


def interval_from_row(row: TelemetryIntervalRow) -> StoredInterval:
    values: dict[str, Any] = {name: getattr(row, name) for name in (*_COUNTS, *_GAUGES)}
    values.update({name: buckets_from_json(getattr(row, name)) for name in _HISTOGRAMS})
    return StoredInterval(
        arm=row.arm,
        arms=row.arms,
        interval=TelemetryInterval(
            start=row.start_at, end=row.end_at, replicas=row.replicas, **values
        ),
        replicas=row.replicas,
        failed_replicas=row.failed_replicas,
        restarted_replicas=row.restarted_replicas,
    )


class SqlTelemetryStore(SqlDatabase):
    """`TelemetryStore` on SQLAlchemy: the arms' scrape intervals."""

    def save_telemetry(self, intervals: Sequence[StoredInterval]) -> None:
        """Store the intervals of one scrape (every arm's) in one transaction, or none."""
        if not intervals:
            return
        rows = [interval_row(stored) for stored in intervals]
        with self._transaction(f"saving {len(rows)} telemetry intervals") as session:
            session.add_all(rows)

    def telemetry(
        self,
        arm: str,
        *,
        arms: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[StoredInterval]:
        """`arm`'s intervals that started at or after `since` and ended at or before
        `until`, oldest first; with `arms`, only those measured under that arms key."""
        query = select(TelemetryIntervalRow).where(TelemetryIntervalRow.arm == arm)
        if arms is not None:
            query = query.where(TelemetryIntervalRow.arms == arms)
        if since is not None:
            query = query.where(TelemetryIntervalRow.start_at >= aware(since, "since"))
        if until is not None:
            query = query.where(TelemetryIntervalRow.end_at <= aware(until, "until"))
        query = query.order_by(TelemetryIntervalRow.end_at, TelemetryIntervalRow.id)
        with self._translating("reading telemetry intervals"), self._sessions() as session:
            return [interval_from_row(row) for row in session.scalars(query)]

    def prune_telemetry(self, before: datetime) -> int:
        """Delete the intervals that ended before `before`; how many went."""
        statement = delete(TelemetryIntervalRow).where(
            TelemetryIntervalRow.end_at < aware(before, "prune telemetry before")
        )
        with self._transaction("deleting old telemetry intervals") as session:
            return int(getattr(session.execute(statement), "rowcount", 0))
