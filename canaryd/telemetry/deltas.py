"""The arithmetic between two scrapes of one arm: what happened in the interval.

Counters and histogram buckets are cumulative, so the interval's counts are differences,
taken per replica and per group of series and then summed, as Prometheus' `increase`
and `sum` do:
- a replica restarted when its `process_start_time_seconds` moved forward to a process
  that started after the previous reading (less `_START_SLACK_S`: clock skew and a
  Prometheus sample's age): every counter of it counts from zero, even one that has
  grown past its old value. Without a start time on both readings, a counter (or a
  histogram's count) restarted when it fell to at most `_RESET_SHARE` of its value: it
  counted up from zero since. A histogram restarts as a whole: when any bucket went
  down, or its buckets changed, its new buckets are the increase;
- a reset shown only by the counters (no start time on both readings) is believed but
  not counted: the interval leaves that replica out and its reading is the next one's
  start (`TelemetryWindow.reset`). Counting its whole value as the increase would credit
  another process's count (a load balancer's other pod, 100,000 clean requests in one
  interval) whenever the "reset" was a second source; a real restart costs one interval
  of one replica. The reading before such a reset is kept as the replica's `ghost` for a
  while (`telemetry_window`'s `ghosts`, held by the scraper): a later reading back at or
  past the ghost's counters is that other process again, and is refused;
- any other way of going down is not a restart, and the replica's reading is refused
  (`contradiction`, named in the window's `refused`): a start time that went back or
  moved to a process already running at the previous reading (a URL that reaches
  several processes: a load balancer over pods), or a counter lower than before with
  the same process start, or lower by less than `_RESET_SHARE` without one (an HA
  Prometheus pair's skew, a load balancer). Re-zeroing would credit the other process's
  whole count as one clean interval; the refused reading is not carried forward, so the
  next interval counts from the last reading that agreed (`carry_forward` keeps it);
- an increase of more finished requests than any serving replica finishes in the time
  (`MAX_REQUESTS_PER_S`) is refused too: a URL whose answers alternate between pods that
  share a start time rises to the other pod's whole count (`implausible`);
- a group of series first seen in the later scrape (Istio creates a 503 series at the
  first 503) counted up from zero within the interval;
- only replicas read at both scrapes count: a replica new in the later one has no start
  to count from, and one that failed has no end (both are named on the window);
- what a scrape did not see is not forgotten (`carry_forward`): a replica that failed
  or a group of series that was absent at one scrape keeps its last values, so when it
  is back its increase is counted from them, not from zero. Prometheus marks a target's
  series stale when one of its scrapes fails, and queries evaluated a moment apart can
  then see a replica with some of its series and without others: counting the
  returning ones from zero counted everything before them again;
- histogram quantiles come from the bucket increases by linear interpolation within the
  bucket that holds the rank, as Prometheus' `histogram_quantile` does (gates.stats.histogram,
  re-exported here);
- gauges (requests running and waiting) are the mean of the two scrapes, summed over
  replicas; an engine's own acceptance gauges are averaged over its series.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TypeVar

from canaryd.telemetry.config import (
    COUNTER_SIGNALS,
    GAUGE_SIGNALS,
    HISTOGRAM_SIGNALS,
    Signal,
)
from canaryd.telemetry.signals import MEAN_GAUGES, ArmReading, GroupKey, ReplicaReading
from gates.stats.histogram import BucketCounts, add_buckets, histogram_quantile
from gates.telemetry.intervals import TelemetryInterval

__all__ = [
    "BucketCounts",
    "TelemetryWindow",
    "add_buckets",
    "carry_forward",
    "contradiction",
    "counter_increase",
    "histogram_increase",
    "histogram_quantile",
    "implausible",
    "restarted",
    "returned_to",
    "telemetry_window",
    "uncounted_reset",
]

_V = TypeVar("_V")
_RESTART_TOLERANCE_S = 1.0  # process_start_time_seconds of one process may wobble
# A restarted process started after the previous reading, less this: the clocks of the
# server and canaryd may differ, and a PromQL reading is a sample up to a scrape old.
_START_SLACK_S = 120.0
# Without a process start time, a counter that fell to at most this share of its value
# counted up from zero again (a restart); one that fell less is another source's value.
_RESET_SHARE = 0.5
# No serving replica finishes more requests a second than this (an LLM server finishes
# tens to hundreds): an increase past it is another process's count, not traffic.
MAX_REQUESTS_PER_S = 10_000


# --- counters and histograms between two scrapes --------------------------------------


def counter_increase(before: float | None, after: float, restarted: bool) -> float:
    """A counter's increase: the difference, or `after` when it restarted, went down, or
    was not there before; never below zero (a counter read below zero counted nothing)."""
    if before is None or restarted or after < before:
        return max(after, 0.0)
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
    """Whether the replica's process started anew between the two readings: its start
    time moved forward (whether to a plausible restart is `contradiction`'s to say)."""
    if before.process_start is None or after.process_start is None:
        return False
    return after.process_start - before.process_start > _RESTART_TOLERANCE_S


def contradiction(before: ReplicaReading, after: ReplicaReading, since: datetime) -> str | None:
    """Why `after` cannot follow `before` (read at `since`) from one serving process, or
    None when it can (module docstring): a process start time that went back, or moved
    to a process already running at `since`; a counter that went down without a restart
    (with the same start time, or by less than `_RESET_SHARE` without one)."""
    old, new = before.process_start, after.process_start
    if old is not None and new is not None:
        if new < old - _RESTART_TOLERANCE_S:
            return (
                f"its process start time went back ({old:.0f} → {new:.0f}): the URL reaches "
                "more than one process (a load balancer over several pods?)"
            )
        if new > old + _RESTART_TOLERANCE_S:
            if new < since.timestamp() - _START_SLACK_S:
                return (
                    f"its process start time changed ({old:.0f} → {new:.0f}) to a process "
                    f"already running at the previous reading ({since.timestamp():.0f}): "
                    "the URL reaches more than one process (a load balancer over several pods?)"
                )
            return None
    fell = _fallen(before, after)
    if not fell:
        return None
    signal, was, now = fell[0]
    if old is not None and new is not None:
        return (
            f"{signal} went down ({was:g} → {now:g}) with the same process start time: "
            "not a restart (an HA Prometheus pair's skew, or a URL that reaches more than "
            "one process?)"
        )
    if all(value <= _RESET_SHARE * previous for _, previous, value in fell):
        return None  # every counter that went down counted up from zero again
    return (
        f"{signal} went down ({was:g} → {now:g}) by less than a restart would "
        f"(to more than {_RESET_SHARE:g} of it, no process start time to show one): an HA "
        "Prometheus pair's skew, or a URL that reaches more than one process?"
    )


def _fallen(before: ReplicaReading, after: ReplicaReading) -> list[tuple[str, float, float]]:
    """Each counter group, and each histogram group's count, that is lower in `after`:
    (signal, value before, value after)."""
    fell = []
    for counter, groups in after.counters.items():
        previous = before.counters.get(counter, {})
        for key, value in groups.items():
            was = previous.get(key)
            if was is not None and value < was:
                fell.append((str(counter), was, value))
    for histogram, histogram_groups in after.histograms.items():
        earlier = before.histograms.get(histogram, {})
        for key, buckets in histogram_groups.items():
            old_buckets = earlier.get(key)
            if not old_buckets or not buckets:
                continue
            was, value = max(old_buckets.values()), max(buckets.values())
            if value < was:
                fell.append((f"{histogram} (count)", was, value))
    return fell


# --- the window ----------------------------------------------------------------------

_SIGNALS: tuple[Signal, ...] = (*COUNTER_SIGNALS, *HISTOGRAM_SIGNALS, *GAUGE_SIGNALS)
_Pairs = list[tuple[ReplicaReading, ReplicaReading]]


@dataclass(frozen=True, slots=True)
class TelemetryWindow:
    """One arm's production telemetry over (`start`, `end`]: the `interval` the telemetry
    gates read (a signal the arm's table does not name is None; a counter it names but no
    series matched counted 0), and what the two scrapes saw of the arm's replicas — those
    that restarted, those new in the later scrape, those that failed — and the signals
    its table names that no replica exposed. `refused`: (URL, why) of each replica whose
    reading contradicts its previous one (`contradiction`) or returns to a `ghost`; its
    counts are not in the window. `reset`: replicas whose counters reset with no start
    time to show it: not counted in this window, their reading the next one's start."""

    arm: str
    interval: TelemetryInterval
    restarted: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    reset: tuple[str, ...] = ()
    new_replicas: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    missing: tuple[Signal, ...] = ()

    @property
    def replicas(self) -> int:
        """The replicas read at both scrapes: the ones the interval counts."""
        return self.interval.replicas or 0


def uncounted_reset(before: ReplicaReading, after: ReplicaReading) -> bool:
    """Whether `after` follows `before` by a reset the counters alone show (no start time
    on both readings; `contradiction` has accepted it)."""
    if before.process_start is not None and after.process_start is not None:
        return False
    return bool(_fallen(before, after))


def returned_to(ghost: ReplicaReading, after: ReplicaReading) -> bool:
    """Whether `after` is back at or past `ghost`'s counters (some in common, none lower)."""
    common = any(
        key in ghost.counters.get(signal, {})
        for signal, groups in after.counters.items()
        for key in groups
    )
    return common and not _fallen(ghost, after)


def implausible(before: ReplicaReading, after: ReplicaReading, seconds: float) -> str | None:
    """Why `after` cannot follow `before` by `seconds` at any serving rate, or None: more
    finished requests than `MAX_REQUESTS_PER_S` a second (a URL whose answers alternate
    between pods that share a start time rises to the other pod's whole count)."""
    counters = _increases([(before, after)])[0]
    requests = counters.get("requests", 0.0)
    if requests <= MAX_REQUESTS_PER_S * max(seconds, 1.0):
        return None
    return (
        f"{requests:.0f} requests finished in {seconds:.0f} s, over {MAX_REQUESTS_PER_S:,} a "
        "second, more than a serving replica finishes: another process's count (a URL that "
        "reaches more than one process?)"
    )


def telemetry_window(
    earlier: ArmReading,
    later: ArmReading,
    ghosts: Mapping[str, ReplicaReading] | None = None,
) -> TelemetryWindow:
    """What the arm did between two of its readings; `ghosts`: per URL, the reading
    before a reset the counters alone showed (module docstring)."""
    if later.at <= earlier.at:
        raise ValueError(f"readings out of order: {earlier.at} is not before {later.at}")
    before = {r.url: r for r in earlier.replicas}
    pairs: _Pairs = []
    refused: list[tuple[str, str]] = []
    reset: list[str] = []
    for replica in later.replicas:
        if replica.url not in before:
            continue
        why = contradiction(before[replica.url], replica, earlier.at)
        ghost = (ghosts or {}).get(replica.url)
        seconds = (later.at - earlier.at).total_seconds()
        if why is None:
            why = implausible(before[replica.url], replica, seconds)
        if why is None and ghost is not None and returned_to(ghost, replica):
            why = (
                "its counters are back at or past their values before a reset a few "
                "readings ago: the URL reaches more than one process (a load balancer over "
                "several pods?); point metrics_url at each replica"
            )
        if why is not None:
            refused.append((replica.url, why))
        elif uncounted_reset(before[replica.url], replica):
            reset.append(replica.url)
        else:
            pairs.append((before[replica.url], replica))
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

    requests, errors = count("requests"), count("errors")
    if requests is not None and errors is not None:
        # Two counters read at one instant agree; a reset of one group and not the other
        # could make them disagree, so errors are capped at the requests.
        errors = min(errors, requests)
    seen = {s for _, new in pairs for s in (*new.counters, *new.histograms, *new.gauges)}
    interval = TelemetryInterval(
        start=earlier.at,
        end=later.at,
        requests=requests,
        errors=errors,
        client_errors=_capped(count("client_errors"), requests),
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
        replicas=len(pairs),
    )
    return TelemetryWindow(
        arm=later.arm,
        interval=interval,
        restarted=tuple(new.url for old, new in pairs if restarted(old, new)),
        refused=tuple(refused),
        reset=tuple(reset),
        new_replicas=tuple(r.url for r in later.replicas if r.url not in before),
        failed=tuple(f.url for f in later.failures),
        missing=tuple(s for s in _SIGNALS if s in mapped and s not in seen),
    )


def _capped(count: int | None, requests: int | None) -> int | None:
    return count if count is None or requests is None else min(count, requests)


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


def carry_forward(
    last: ArmReading, reading: ArmReading, refused: Collection[str] = ()
) -> ArmReading:
    """`reading` as the start of the next interval: each replica it read, with the counter
    and histogram groups it lacks but had at `last` (unless it restarted) carried over,
    and each replica of `last` it did not read, or whose reading was `refused` (URLs),
    carried over whole."""
    earlier = {r.url: r for r in last.replicas}
    replicas = []
    for replica in reading.replicas:
        if replica.url in refused and replica.url in earlier:
            continue
        old = earlier.pop(replica.url, None)
        if old is None or restarted(old, replica):
            replicas.append(replica)
            continue
        replicas.append(
            replace(
                replica,
                counters=_merged(old.counters, replica.counters),
                histograms=_merged(old.histograms, replica.histograms),
            )
        )
    return replace(reading, replicas=(*replicas, *earlier.values()))


def _merged(
    old: Mapping[Signal, Mapping[GroupKey, _V]], new: Mapping[Signal, Mapping[GroupKey, _V]]
) -> dict[Signal, dict[GroupKey, _V]]:
    merged = {signal: dict(groups) for signal, groups in old.items()}
    for signal, groups in new.items():
        merged.setdefault(signal, {}).update(groups)
    return merged
