"""Bucket arithmetic the telemetry gates read (gates.stats.histogram): the bucket holding a
quantile, observations certainly above a value, and the interpolated count at or below
it (the inverse of Prometheus' `histogram_quantile`)."""

from __future__ import annotations

import pytest

from gates.stats.histogram import BucketCounts, bucket_quantile, count_above, count_at_or_below

INF = float("inf")
BUCKETS = BucketCounts((1.0, 2.0, 4.0, INF), (10.0, 20.0, 30.0, 40.0))


class TestBucketQuantile:
    def test_names_the_bucket_holding_the_quantile(self) -> None:
        """The median of 40 observations lies in (1, 2]: interpolated 2.0 exactly at the
        rank's bound; a rank in the +inf bucket is beyond the buckets."""
        median = bucket_quantile(0.5, BUCKETS)
        assert median is not None and (median.value, median.low, median.high) == (2.0, 1.0, 2.0)
        tail = bucket_quantile(0.9, BUCKETS)
        assert tail is not None and tail.beyond_buckets and tail.value == 4.0
        assert bucket_quantile(0.5, BucketCounts((1.0, INF), (0.0, 0.0))) is None


class TestCounts:
    def test_certainly_above_counts_whole_buckets_only(self) -> None:
        """Above 1.5 are certainly those past 2 (20); above 2 the same; past the largest
        finite bound nothing is certain (the +inf bucket may start below)."""
        assert count_above(BUCKETS, 1.5) == 20.0
        assert count_above(BUCKETS, 2.0) == 20.0
        assert count_above(BUCKETS, 0.5) == 30.0
        assert count_above(BUCKETS, 5.0) == 0.0

    def test_at_or_below_interpolates_inside_a_bucket(self) -> None:
        """Halfway through (1, 2] is halfway through its ten observations; at or past
        the largest finite bound everything counts as not above."""
        assert count_at_or_below(BUCKETS, 1.5) == pytest.approx(15.0)
        assert count_at_or_below(BUCKETS, 0.5) == pytest.approx(5.0)
        assert count_at_or_below(BUCKETS, 4.0) == 30.0
        assert count_at_or_below(BUCKETS, 10.0) == 40.0

    def test_inverse_of_the_quantile(self) -> None:
        """count_at_or_below(histogram_quantile(q)) is q × count inside finite buckets."""
        for q in (0.1, 0.3, 0.55, 0.7):
            value = BUCKETS.quantile(q)
            assert value is not None
            assert count_at_or_below(BUCKETS, value) == pytest.approx(q * BUCKETS.count)
