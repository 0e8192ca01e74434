"""The `telemetry.errors` gate: does the speculative arm fail more production requests than
the baseline?

It reads both arms' request and error counts from their own telemetry (a serving
engine's finish reasons, a gateway's 5xx), interval by interval, over the window. The arms
serve different requests, so the comparison is of two independent rates, per request:
- FAIL: a likelihood-ratio CUSUM over the speculative arm's intervals, oldest first. Each
  interval adds the log-likelihood ratio of its k errors in n requests, k·log(p1/p0) +
  (n − k)·log((1 − p1)/(1 − p0)): exactly the sum of its requests' Bernoulli increments,
  so a busy minute weighs as much as its requests do, not as one scrape. The in-control
  rate p0 is the edge of what is tolerated, the baseline's rate (its upper bound at the
  calibration level) plus `max_excess_rate`; the alternatives are `alarm_factor` × p0 and
  4× and 16× that (a bank: a speculative arm failing a third of its requests decides in
  tens of requests). The threshold is log(`arl0`), `arl0` counted in intervals (the
  CUSUM's observations): the caller sizes it for its scrape interval.
- PASS: the upper bound of the excess (speculative minus baseline rate) within
  `max_excess_rate`, at the gate's confidence, with at least `min_samples` requests per
  arm: the Agresti–Caffo bound for a difference of independent proportions (one error and
  one success added to each arm), which holds its level down to a few errors.
Intervals in a **shared outage** say nothing about the speculative arm: a baseline
interval whose error count a calm baseline (failing at the window's rate) reaches with
probability at most `outage_alpha`, and `outage_margin_intervals` on each side, are left
out of the baseline's rate, and every speculative interval overlapping one of them is
left out of both detectors. So is a speculative interval no baseline interval overlaps (a
failed baseline scrape): without the baseline there is no excess to judge. The rule reads
the baseline only, so it leaves out speculative intervals independently of their errors.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from scipy.stats import binom, norm

from gates.config import TelemetryErrorGateConfig
from gates.core import GateDecision, GateState
from gates.stats.descriptive import clopper_pearson
from gates.stats.detectors import (
    CALIBRATION_CONFIDENCE,
    rate_alternatives,
    reading,
    sequential_state,
)
from gates.stats.sequential import LlrCusum, bernoulli_llr, cusum_bank, lorden_threshold
from gates.telemetry.intervals import CountInterval, TelemetryCounts
from gates.window import Window, decision

NAME = "telemetry.errors"
_RATE_FLOOR = 1e-4  # a baseline that never fails still gets a positive in-control rate
_STATISTIC = "excess error rate per request, speculative − baseline"


def telemetry_errors_gate(
    baseline: TelemetryCounts,
    speculative: TelemetryCounts,
    config: TelemetryErrorGateConfig,
    *,
    now: datetime,
    arl0: float,
    since: datetime | None = None,
) -> GateDecision:
    """FAIL when the CUSUM alarms, PASS when the excess's upper bound holds; NODATA below
    `min_samples` requests per arm. `since` (the start of the current evidence) drops
    intervals that started before it."""
    base = select_intervals(baseline, config, now, since)
    spec = select_intervals(speculative, config, now, since)
    outage = shared_outages(base, alpha=config.outage_alpha, margin=config.outage_margin_intervals)
    calm_base = [i for i, out in zip(base, outage, strict=True) if not out]
    judged, in_outage, uncovered = screen(spec, base, outage)
    n_base = sum(i.requests for i in calm_base)
    n_spec = sum(i.requests for i in judged)
    window = Window(
        (),
        min((i.start for i in [*calm_base, *judged]), default=None),
        max((i.end for i in [*calm_base, *judged]), default=None),
    )
    left_out = (
        f"left out: {len(base) - len(calm_base)} baseline intervals in shared outages, "
        f"{in_outage} speculative intervals overlapping them, {uncovered} with no "
        "baseline interval beside them"
    )
    if n_base == 0 or n_spec == 0:
        return decision(
            NAME,
            config,
            window,
            now,
            state=GateState.NODATA,
            statistic=_STATISTIC,
            n_baseline=n_base,
            n_speculative=n_spec,
            threshold=float(config.min_samples),
            detail=f"{n_base} baseline and {n_spec} speculative requests in the window, "
            f"fewer than min_samples={config.min_samples}; {left_out}",
        )
    errors_base = sum(i.errors for i in calm_base)
    errors_spec = sum(i.errors for i in judged)
    _, base_upper = clopper_pearson(errors_base, n_base, CALIBRATION_CONFIDENCE)
    # The edge of acceptable: the baseline's own rate (its upper bound) plus the excess
    # tolerated; the alarm is for `alarm_factor` times that and beyond.
    p0 = min(max(base_upper, _RATE_FLOOR) + config.max_excess_rate, 0.5)
    alternatives = rate_alternatives(p0, min(config.alarm_factor * p0, 0.99))
    h = lorden_threshold(arl0)
    cusum, chart, h = cusum_bank([interval_increments(judged, p0, p1) for p1 in alternatives], h)
    excess = errors_spec / n_spec - errors_base / n_base
    lower, upper = excess_bounds(errors_spec, n_spec, errors_base, n_base, config.confidence)
    state = sequential_state(
        cusum,
        h,
        min(n_base, n_spec),
        config.min_samples,
        passed=upper <= config.max_excess_rate,
        warned=excess > config.max_excess_rate,
    )
    return decision(
        NAME,
        config,
        window,
        now,
        state=state,
        statistic=_STATISTIC,
        n_baseline=n_base,
        n_speculative=n_spec,
        estimate=excess,
        lower=lower,
        upper=upper,
        threshold=config.max_excess_rate,
        detail=f"{_STATISTIC} {excess:.4f} (upper bound {upper:.4f}) vs max "
        f"{config.max_excess_rate:g}; speculative {errors_spec}/{n_spec} errors in "
        f"{len(judged)} intervals, baseline {errors_base}/{n_base}; "
        f"{interval_note(cusum, h)} for p {p0:.4g} → "
        f"{alternatives[chart]:.4g}; {left_out}",
        detector=reading(cusum, h),
    )


def select_intervals(
    counts: TelemetryCounts,
    config: TelemetryErrorGateConfig,
    now: datetime,
    since: datetime | None,
) -> list[CountInterval]:
    """Intervals that ended at or before `now` and within `window_seconds` of it, started
    at or after `since`, the last `window_pairs` of them, oldest first."""
    chosen = [i for i in counts.intervals if i.end <= now and (since is None or i.start >= since)]
    if config.window_seconds is not None:
        oldest = now - timedelta(seconds=config.window_seconds)
        chosen = [i for i in chosen if i.end > oldest]
    if config.window_pairs is not None:
        chosen = chosen[-config.window_pairs :]
    return chosen


def shared_outages(baseline: Sequence[CountInterval], *, alpha: float, margin: int) -> list[bool]:
    """Which baseline intervals lie in a shared outage: those with at least two errors
    and an error count a baseline failing at the window's calm rate (its Clopper–Pearson
    upper bound) reaches with probability at most `alpha`, and `margin` on each side."""
    requests = sum(i.requests for i in baseline)
    if requests == 0:
        return [False] * len(baseline)
    _, calm = clopper_pearson(sum(i.errors for i in baseline), requests, CALIBRATION_CONFIDENCE)
    rate = min(max(calm, _RATE_FLOOR), 0.5)
    flagged = [
        index
        for index, interval in enumerate(baseline)
        if interval.errors >= 2
        and float(binom.sf(interval.errors - 1, interval.requests, rate)) <= alpha
    ]
    out = [False] * len(baseline)
    for index in flagged:
        for near in range(max(index - margin, 0), min(index + margin + 1, len(baseline))):
            out[near] = True
    return out


def screen(
    speculative: Sequence[CountInterval],
    baseline: Sequence[CountInterval],
    outage: Sequence[bool],
) -> tuple[list[CountInterval], int, int]:
    """The speculative intervals judged, and how many were left out for overlapping a
    baseline outage and for overlapping no baseline interval at all."""
    ends = [i.end for i in baseline]
    judged: list[CountInterval] = []
    in_outage = uncovered = 0
    for interval in speculative:
        index = bisect.bisect_right(ends, interval.start)
        covered = hit = False
        while index < len(baseline) and baseline[index].start < interval.end:
            covered = True
            hit = hit or outage[index]
            index += 1
        if not covered:
            uncovered += 1
        elif hit:
            in_outage += 1
        else:
            judged.append(interval)
    return judged, in_outage, uncovered


def interval_increments(intervals: Sequence[CountInterval], p0: float, p1: float) -> list[float]:
    """Each interval's log-likelihood ratio of Bernoulli(p1) against Bernoulli(p0) over
    its requests: errors × log-LR of a failure + successes × log-LR of a success."""
    failure, success = bernoulli_llr(p0, p1)
    return [i.errors * failure + (i.requests - i.errors) * success for i in intervals]


def interval_note(cusum: LlrCusum, h: float) -> str:
    """The detector's figures, its excursion's start counted in judged intervals."""
    change = (
        f", excursion from interval {cusum.change_index + 1}"
        if cusum.change_index is not None and cusum.peak > 0
        else ""
    )
    return f"CUSUM {cusum.statistic:.2f} (peak {cusum.peak:.2f}) vs h {h:.2f}{change}"


def excess_bounds(
    errors_first: int, n_first: int, errors_second: int, n_second: int, confidence: float
) -> tuple[float, float]:
    """One-sided lower and upper bounds, each at `confidence`, on rate(first) −
    rate(second) from independent samples (Agresti & Caffo 2000: one success and one
    failure added to each sample, then the Wald interval); clipped to [−1, 1]."""
    first = (errors_first + 1) / (n_first + 2)
    second = (errors_second + 1) / (n_second + 2)
    spread = math.sqrt(first * (1 - first) / (n_first + 2) + second * (1 - second) / (n_second + 2))
    half = float(norm.ppf(confidence)) * spread
    difference = first - second
    return max(difference - half, -1.0), min(difference + half, 1.0)
