"""The telemetry records the gates read (gates.telemetry.intervals): an interval checks its counts,
an arm's intervals are sorted, and the error counts are the intervals that have both
requests and errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gates.stats.histogram import BucketCounts
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence, TelemetryInterval

T0 = datetime(2025, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=15)


def at(index: int, **signals: Any) -> TelemetryInterval:
    return TelemetryInterval(T0 + index * STEP, T0 + (index + 1) * STEP, **signals)


class TestTelemetryInterval:
    def test_rejects_impossible_counts(self) -> None:
        """An interval that ends before it starts, a negative count or more errors than
        requests is refused, naming the figures."""
        with pytest.raises(ValueError, match="ends after it starts"):
            TelemetryInterval(T0, T0)
        with pytest.raises(ValueError, match="drafts is a count, got -1"):
            at(0, drafts=-1)
        with pytest.raises(ValueError, match="got 3 errors of 2 requests"):
            at(0, requests=2, errors=3)

    def test_load_needs_both_gauges(self) -> None:
        """Load is running + waiting, None when either gauge is unknown."""
        assert at(0, running=2.0, waiting=0.5).load == 2.5
        assert at(0, running=2.0).load is None


class TestArmTelemetry:
    def test_sorted_and_counted(self) -> None:
        """Intervals are kept oldest first; counts() keeps those with requests and errors,
        as the `telemetry.errors` gate reads them."""
        e2e = BucketCounts.of({1.0: 1.0, float("inf"): 2.0})
        arm = ArmTelemetry.of(
            [at(2, requests=5, errors=1), at(0, requests=4, errors=0), at(1, e2e=e2e)]
        )
        assert [i.start for i in arm.intervals] == [T0, T0 + STEP, T0 + 2 * STEP]
        counts = arm.counts()
        assert (len(counts.intervals), counts.requests, counts.errors) == (2, 9, 1)
        evidence = TelemetryEvidence(baseline=arm)
        assert evidence.speculative.intervals == ()
