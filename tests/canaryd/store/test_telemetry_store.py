"""The arms' telemetry in SQL (canaryd.store.telemetry_sql), on SQLite and PostgreSQL: an
interval round-trips field for field (histograms with their +inf bound, unknown signals
as NULL); a read picks one arm, one arms key and a window, oldest first; pruning deletes
what ended before a time and nothing else; no interval's histograms take more than 64 KB,
and the most bounds the scrape lets through take less."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from canaryd.store import SqlStore, StoredInterval
from canaryd.store.telemetry_sql import (
    MAX_INTERVAL_BYTES,
    buckets_from_json,
    buckets_json,
    interval_json_bytes,
)
from canaryd.telemetry.config import TelemetryConfig
from gates.stats.histogram import BucketCounts
from gates.telemetry.intervals import TelemetryInterval

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
STEP = timedelta(seconds=15)
E2E = BucketCounts((0.5, 1.0, 2.5, math.inf), (3.0, 40.0, 58.0, 60.0))


def stored(
    index: int, *, arm: str = "speculative", arms: str = "key-a", **fields: object
) -> StoredInterval:
    interval = TelemetryInterval(
        start=T0 + index * STEP,
        end=T0 + (index + 1) * STEP,
        **{"requests": 60, "errors": 1, "replicas": 2, **fields},  # type: ignore[arg-type]
    )
    return StoredInterval(arm=arm, arms=arms, interval=interval, replicas=2)


class TestHistogramJson:
    def test_round_trip_keeps_the_infinite_bound(self) -> None:
        """+inf is written as "+Inf" (JSON has none) and read back as infinity."""
        encoded = buckets_json(E2E)
        assert encoded == {"le": [0.5, 1.0, 2.5, "+Inf"], "count": [3.0, 40.0, 58.0, 60.0]}
        assert buckets_from_json(encoded) == E2E
        assert buckets_json(None) is None and buckets_from_json(None) is None


def widest(bounds: int) -> BucketCounts:
    """A histogram of `bounds` bounds, each bound and count as long as a float prints."""
    finite = tuple(1.2345678901234567e-05 * (1 + i / 7) for i in range(bounds - 1))
    return BucketCounts(
        (*finite, math.inf), tuple(1.2345678901234567e17 + i for i in range(bounds))
    )


class TestIntervalSize:
    def test_the_most_bounds_the_scrape_allows_store_under_64_kb(self, store: SqlStore) -> None:
        """Three histograms at the largest `telemetry.max_buckets` allowed: under 64 KB."""
        cap = TelemetryConfig(max_buckets=256).max_buckets  # the most it takes (257 is refused)
        histograms = {name: widest(cap) for name in ("e2e", "ttft", "itl")}
        interval = stored(0, **histograms)
        assert interval_json_bytes(interval.interval) < MAX_INTERVAL_BYTES
        store.save_telemetry([interval])
        assert store.telemetry("speculative")[0].interval.e2e == histograms["e2e"]

    def test_an_interval_over_64_kb_is_refused(self, store: SqlStore) -> None:
        """139,000 bounds would take megabytes a row: the store refuses it, naming why."""
        with pytest.raises(ValueError, match="over 65536: the scrape should have refused it"):
            store.save_telemetry([stored(0, e2e=widest(2000))])
        assert store.telemetry("speculative") == []


class TestTelemetryStore:
    def test_an_interval_round_trips(self, store: SqlStore) -> None:
        """Every field comes back as saved: counts, gauges, histograms, replica counts;
        a signal the source does not give stays None."""
        full = StoredInterval(
            arm="speculative",
            arms="key-a",
            interval=TelemetryInterval(
                start=T0,
                end=T0 + STEP,
                requests=60,
                errors=2,
                client_errors=5,
                e2e=E2E,
                ttft=BucketCounts((0.1, math.inf), (50.0, 60.0)),
                running=6.5,
                waiting=0.5,
                drafts=900,
                draft_tokens=4500,
                accepted_tokens=2100,
                replicas=2,
            ),
            replicas=2,
            failed_replicas=1,
            restarted_replicas=1,
        )
        store.save_telemetry([full])
        (read,) = store.telemetry("speculative")
        assert read == full
        assert read.interval.itl is None and read.interval.reported_acceptance_length is None

    def test_a_read_picks_the_arm_the_key_and_the_window(self, store: SqlStore) -> None:
        """Only `arm`'s intervals under `arms`, started at or after `since` and ended at or
        before `until`, oldest first."""
        store.save_telemetry(
            [
                stored(2),
                stored(0),
                stored(1),
                stored(3),
                stored(1, arm="baseline"),
                stored(1, arms="key-b"),
            ]
        )
        everything = store.telemetry("speculative", arms="key-a")
        assert [s.interval.start for s in everything] == [T0 + i * STEP for i in range(4)]
        window = store.telemetry("speculative", arms="key-a", since=T0 + STEP, until=T0 + 3 * STEP)
        assert [s.interval.start for s in window] == [T0 + STEP, T0 + 2 * STEP]
        assert len(store.telemetry("speculative")) == 5
        assert [s.arm for s in store.telemetry("baseline")] == ["baseline"]

    def test_pruning_deletes_only_what_ended_before(self, store: SqlStore) -> None:
        """Intervals that ended before the cut go, of every arm; the rest stay."""
        store.save_telemetry([stored(i) for i in range(4)] + [stored(0, arm="baseline")])
        assert store.prune_telemetry(T0 + 2 * STEP) == 2  # ended at T0+15 s (both arms)
        assert [s.interval.start for s in store.telemetry("speculative")] == [
            T0 + i * STEP for i in (1, 2, 3)
        ]
        assert store.telemetry("baseline") == []

    def test_naive_times_are_refused(self, store: SqlStore) -> None:
        """A naive datetime never reaches a row."""
        naive = StoredInterval(
            arm="speculative",
            arms="k",
            interval=TelemetryInterval(start=datetime(2026, 1, 1), end=datetime(2026, 1, 2)),
            replicas=1,
        )
        with pytest.raises(ValueError, match="naive"):
            store.save_telemetry([naive])
        assert store.telemetry("speculative") == []
