"""Histogram arithmetic on cumulative bucket counts: the `BucketCounts` of an interval,
Prometheus' `histogram_quantile`, and sums of histograms with different bounds.

A serving engine exports each latency as cumulative buckets (`le` upper bounds, the last
+inf); the increase of those buckets over an interval is what the telemetry gates read.
The arithmetic is pure, so the gates and canaryd's telemetry package share one copy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BucketCounts:
    """A histogram's increase over an interval: ascending upper bounds in seconds (the
    last +inf) and the cumulative count of observations at or below each."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]

    @classmethod
    def of(cls, buckets: Mapping[float, float]) -> BucketCounts:
        """Buckets `{upper bound: cumulative count}`, made monotone as Prometheus does (a
        count below its lower neighbour's, from a scrape between two updates, is raised
        to it)."""
        bounds = tuple(sorted(buckets))
        cumulative: list[float] = []
        for bound in bounds:
            cumulative.append(max(buckets[bound], cumulative[-1] if cumulative else 0.0))
        return cls(bounds, tuple(cumulative))

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self)

    def as_mapping(self) -> dict[float, float]:
        """`{upper bound: cumulative count}`, the form `add_buckets` sums."""
        return dict(zip(self.bounds, self.cumulative, strict=True))


def histogram_quantile(q: float, buckets: BucketCounts) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) by Prometheus' rule: find the bucket holding rank
    q × count, interpolate linearly between its lower and upper bound (the first bucket
    starts at 0 unless its bound is not positive); a rank in the +inf bucket is the
    largest finite bound. None without observations or without a +inf bucket."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q={q!r} is outside [0, 1]")
    bounds, cumulative = buckets.bounds, buckets.cumulative
    if len(bounds) < 2 or not math.isinf(bounds[-1]) or cumulative[-1] <= 0:
        return None
    rank = q * cumulative[-1]
    index = bisect.bisect_left(cumulative, rank)
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else cumulative[index - 1]
    inside = cumulative[index] - below
    if inside <= 0:
        return bounds[index]
    return start + (bounds[index] - start) * (rank - below) / inside


def add_buckets(histograms: Iterable[Mapping[float, float]]) -> dict[float, float]:
    """Cumulative buckets summed by upper bound. A histogram without some bound counts,
    at it, what it counts at its next lower bound (its cumulative count is a step)."""
    parts = [dict(sorted(h.items())) for h in histograms if h]
    bounds = sorted({b for part in parts for b in part})
    total = dict.fromkeys(bounds, 0.0)
    for part in parts:
        own = list(part)
        for bound in bounds:
            index = bisect.bisect_right(own, bound) - 1
            if index >= 0:
                total[bound] += part[own[index]]
    return total


@dataclass(frozen=True, slots=True)
class BucketQuantile:
    """A quantile read from buckets: the interpolated `value` (Prometheus' rule) and the
    bucket (`low`, `high`] that holds it, the resolution the buckets allow. `high` is
    +inf when the rank lies in the +inf bucket: the quantile is then beyond the largest
    finite bound, and `value` (that bound) only a lower bound of it."""

    value: float
    low: float
    high: float

    @property
    def beyond_buckets(self) -> bool:
        return math.isinf(self.high)


def bucket_quantile(q: float, buckets: BucketCounts) -> BucketQuantile | None:
    """The q-quantile with the bucket that holds it; None without observations."""
    value = histogram_quantile(q, buckets)
    if value is None:
        return None
    bounds, cumulative = buckets.bounds, buckets.cumulative
    index = min(bisect.bisect_left(cumulative, q * cumulative[-1]), len(bounds) - 1)
    low = 0.0 if index == 0 else bounds[index - 1]
    return BucketQuantile(value, min(low, value), bounds[index])


def count_above(buckets: BucketCounts, x: float) -> float:
    """Observations certainly above `x`: those past the first bound at or above it.
    However the observations lie inside their buckets, at least this many exceed `x`."""
    bounds, cumulative = buckets.bounds, buckets.cumulative
    index = bisect.bisect_left(bounds, x)
    if index >= len(bounds) or math.isinf(bounds[index]):
        return 0.0  # past the largest finite bound: the +inf bucket may start below x
    return cumulative[-1] - cumulative[index]


def count_at_or_below(buckets: BucketCounts, x: float) -> float:
    """Observations at or below `x`, interpolated linearly inside the bucket holding it
    (the inverse of `histogram_quantile`). Past the largest finite bound the +inf bucket
    is counted as not above `x`: the buckets cannot say how far it reaches."""
    bounds, cumulative = buckets.bounds, buckets.cumulative
    if not bounds:
        return 0.0
    index = bisect.bisect_left(bounds, x)
    if index >= len(bounds) or math.isinf(bounds[index]):
        return cumulative[-1]
    below = 0.0 if index == 0 else cumulative[index - 1]
    start = 0.0 if index == 0 else bounds[index - 1]
    width = bounds[index] - start
    if width <= 0 or x <= start:
        return below if x < bounds[index] else cumulative[index]
    return below + (cumulative[index] - below) * (x - start) / width
