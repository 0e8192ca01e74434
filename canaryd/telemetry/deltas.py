"""The arithmetic between two scrapes of one arm: what happened in the interval.

Counters and histogram buckets are cumulative, so the interval's counts are differences,
taken per replica and per group of series and then summed, as Prometheus' `increase`
and `sum` do:
- a counter that went down restarted, and its new value is the increase (it counted up
  from zero since); so is every counter of a replica whose `process_start_time_seconds`
  changed, even one that has grown past its old value. A histogram restarts as a whole:
  when any bucket went down, or its buckets changed, its new buckets are the increase;
- a group of series first seen in the later scrape (Istio creates a 503 series at the
  first 503) counted up from zero within the interval;
- only replicas read at both scrapes count: a replica new in the later one has no start
  to count from, and one that failed has no end (both are named on the window);
- histogram quantiles come from the bucket increases by linear interpolation within the
  bucket that holds the rank, as Prometheus' `histogram_quantile` does;
- gauges (requests running and waiting) are the mean of the two scrapes, summed over
  replicas; an engine's own acceptance gauges are averaged over its series.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from canaryd.telemetry.config import (
    COUNTER_SIGNALS,
    GAUGE_SIGNALS,
    HISTOGRAM_SIGNALS,
    Signal,
)
from canaryd.telemetry.signals import MEAN_GAUGES, ArmReading, ReplicaReading
from gates.telemetry import CountInterval

_RESTART_TOLERANCE_S = 1.0  # process_start_time_seconds of one process may wobble


# --- histograms ------------------------------------------------------------------------


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


# --- counters and histograms between two scrapes --------------------------------------


def counter_increase(before: float | None, after: float, restarted: bool) -> float:
    """A counter's increase: the difference, or `after` when it restarted, went down, or
    was not there before."""
    if before is None or restarted or after < before:
        return after
    return after - before


def histogram_increase(
    before: Mapping[float, float] | None, after: Mapping[float, float], restarted: bool
) -> dict[float, float]:
    """A histogram group's bucket increases; all of `after` when it restarted."""
    if (
        before is None
        or restarted
        or set(before) != set(after)
        or any(after[b] < before[b] for b in after)
    ):
        return dict(after)
    return {b: after[b] - before[b] for b in after}


def restarted(before: ReplicaReading, after: ReplicaReading) -> bool:
    """Whether the replica's process started anew between the two readings."""
    if before.process_start is None or after.process_start is None:
        return False
    return abs(after.process_start - before.process_start) > _RESTART_TOLERANCE_S


# --- the window ----------------------------------------------------------------------

_SIGNALS: tuple[Signal, ...] = (*COUNTER_SIGNALS, *HISTOGRAM_SIGNALS, *GAUGE_SIGNALS)
_Pairs = list[tuple[ReplicaReading, ReplicaReading]]


@dataclass(frozen=True, slots=True)
class TelemetryWindow:
    """One arm's production telemetry over (`start`, `end`]. A signal the arm's table
    does not name is None; a counter it names but no series matched counted 0."""

    arm: str
    start: datetime
    end: datetime
    replicas: int
    restarted: tuple[str, ...] = ()
    new_replicas: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    missing: tuple[Signal, ...] = ()
    requests: int | None = None
    errors: int | None = None
    e2e: BucketCounts | None = None
    ttft: BucketCounts | None = None
    itl: BucketCounts | None = None
    running: float | None = None
    waiting: float | None = None
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    reported_acceptance_length: float | None = None
    reported_acceptance_rate: float | None = None

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted ÷ drafts (the bonus token counted, as vLLM does), else the length
        the engine reports; None without drafts."""
        if self.drafts and self.accepted_tokens is not None:
            return 1.0 + self.accepted_tokens / self.drafts
        return self.reported_acceptance_length

    @property
    def acceptance_rate(self) -> float | None:
        """accepted ÷ draft tokens, else the rate the engine reports."""
        if self.draft_tokens and self.accepted_tokens is not None:
            return self.accepted_tokens / self.draft_tokens
        return self.reported_acceptance_rate

    def count_interval(self) -> CountInterval | None:
        """The window as the error gates read it; None without request and error counts.
        Errors are capped at the requests (two counters read at one instant agree; a
        reset of one group and not the other could make them disagree)."""
        if self.requests is None or self.errors is None or self.end <= self.start:
            return None
        return CountInterval(self.start, self.end, self.requests, min(self.errors, self.requests))


def telemetry_window(earlier: ArmReading, later: ArmReading) -> TelemetryWindow:
    """What the arm did between two of its readings."""
    if later.at <= earlier.at:
        raise ValueError(f"readings out of order: {earlier.at} is not before {later.at}")
    before = {r.url: r for r in earlier.replicas}
    pairs = [(before[r.url], r) for r in later.replicas if r.url in before]
    counters, histograms = _increases(pairs)
    mapped = later.mapped

    def count(signal: Signal) -> int | None:
        if signal not in mapped or not pairs:
            return None
        return round(counters.get(signal, 0.0))

    def bucket_counts(signal: Signal) -> BucketCounts | None:
        if signal not in histograms:
            return None
        return BucketCounts.of(add_buckets(histograms[signal]))

    seen = {s for _, new in pairs for s in (*new.counters, *new.histograms, *new.gauges)}
    return TelemetryWindow(
        arm=later.arm,
        start=earlier.at,
        end=later.at,
        replicas=len(pairs),
        restarted=tuple(new.url for old, new in pairs if restarted(old, new)),
        new_replicas=tuple(r.url for r in later.replicas if r.url not in before),
        failed=tuple(f.url for f in later.failures),
        missing=tuple(s for s in _SIGNALS if s in mapped and s not in seen),
        requests=count("requests"),
        errors=count("errors"),
        e2e=bucket_counts("e2e"),
        ttft=bucket_counts("ttft"),
        itl=bucket_counts("itl"),
        running=_gauge("running", pairs),
        waiting=_gauge("waiting", pairs),
        drafts=count("drafts"),
        draft_tokens=count("draft_tokens"),
        accepted_tokens=count("accepted_tokens"),
        reported_acceptance_length=_gauge("acceptance_length", pairs),
        reported_acceptance_rate=_gauge("acceptance_rate", pairs),
    )


def _increases(
    pairs: _Pairs,
) -> tuple[dict[Signal, float], dict[Signal, list[dict[float, float]]]]:
    """Per counter signal its increase summed over replicas and groups; per histogram
    signal the bucket increases of every replica's groups."""
    counters: dict[Signal, float] = {}
    histograms: dict[Signal, list[dict[float, float]]] = {}
    for old, new in pairs:
        reset = restarted(old, new)
        for counter in COUNTER_SIGNALS:
            previous = old.counters.get(counter, {})
            for key, value in new.counters.get(counter, {}).items():
                increase = counter_increase(previous.get(key), value, reset)
                counters[counter] = counters.get(counter, 0.0) + increase
        for histogram in HISTOGRAM_SIGNALS:
            earlier_groups = old.histograms.get(histogram, {})
            for key, buckets in new.histograms.get(histogram, {}).items():
                histograms.setdefault(histogram, []).append(
                    histogram_increase(earlier_groups.get(key), buckets, reset)
                )
    return counters, histograms


def _gauge(signal: Signal, pairs: _Pairs) -> float | None:
    """A summed gauge: the mean of the two readings, summed over replicas. A mean gauge
    (acceptance): the later readings' mean over every series."""
    if signal in MEAN_GAUGES:
        readings = [new.gauges[signal] for _, new in pairs if signal in new.gauges]
        series = sum(n for _, n in readings)
        return sum(total for total, _ in readings) / series if series else None
    values = [
        (old.gauges[signal][0] + new.gauges[signal][0]) / 2.0
        for old, new in pairs
        if signal in old.gauges and signal in new.gauges
    ]
    return sum(values) if values else None
