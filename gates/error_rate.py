"""The error-rate gate: is the speculative arm failing more often than the baseline?

Two detectors on the window's pairs, oldest first. Pairs where both arms failed say
nothing about the speculative arm (a shared outage) and are left out of both.
- paired: a Bernoulli CUSUM on speculative-only failures. Its in-control rate p0 is the
  edge of what is tolerated: the upper confidence bound of the baseline-only failure
  rate in the same window (equal arms fail alone equally often) plus `max_excess_rate`;
  its alternative is `alarm_factor` × p0, with gross ones at 4× and 16× that (a bank:
  a speculative arm failing a third of its requests decides in tens of pairs, not
  hundreds). An excess within the tolerance pushes the statistic down, never up.
  PASS when the paired excess (speculative-only minus baseline-only rate) has an upper
  bound within `max_excess_rate`: the Bonett–Price adjusted Wald bound for a difference
  of paired proportions (one cell added to each discordant count), which uses the
  pairing — a bound from the two rates' separate intervals needs about twice the pairs.
- ceiling: a Bernoulli CUSUM on speculative failures among pairs whose baseline
  succeeded, Bernoulli(`alarm_factor` × `max_error_rate`, and 4× and 16× that) against
  Bernoulli(`max_error_rate`); PASS when the Clopper–Pearson upper bound is under the
  ceiling.
A timeout, an HTTP error, an OOM or an invalid response all count as errors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from scipy.stats import norm

from gates.budget import DEFAULT_ARL0
from gates.config import ErrorGateConfig
from gates.core import GateDecision
from gates.detectors import CALIBRATION_CONFIDENCE, rate_alternatives, rate_check
from gates.records import PairRecord
from gates.sequential import lorden_threshold
from gates.stats import clopper_pearson
from gates.window import combined, nodata, select

NAME = "error"
_RATE_FLOOR = 1e-4  # a baseline that never fails still gets a positive in-control rate


def error_gate(
    records: Sequence[PairRecord],
    config: ErrorGateConfig,
    *,
    now: datetime,
    arl0: float = DEFAULT_ARL0,
    since: datetime | None = None,
) -> GateDecision:
    """FAIL when either detector alarms; PASS when both bounds hold."""
    window = select(records, config, now, since)
    judged = [r for r in window.records if r.baseline.ok or r.speculative.ok]
    if not judged:
        return nodata(NAME, config, window, now, 0)
    h = lorden_threshold(arl0)
    n = len(judged)
    both_failed = len(window.records) - n
    baseline_only = sum(1 for r in judged if not r.baseline.ok)
    _, baseline_upper = clopper_pearson(baseline_only, n, CALIBRATION_CONFIDENCE)
    speculative_only = sum(1 for r in judged if not r.speculative.ok)
    excess = (speculative_only - baseline_only) / n
    excess_bounds = (
        excess,
        *paired_difference_bounds(speculative_only, baseline_only, n, config.confidence),
    )
    # The edge of acceptable: the baseline's own rate (its upper bound) plus the excess
    # tolerated; the alarm is for `alarm_factor` times that.
    p0 = min(max(baseline_upper, _RATE_FLOOR) + config.max_excess_rate, 0.5)
    paired = rate_check(
        f"{NAME}.paired",
        config,
        window,
        now,
        hits=[not r.speculative.ok for r in judged],
        tolerance=config.max_excess_rate,
        p0=p0,
        p1=rate_alternatives(p0, min(config.alarm_factor * p0, 0.99)),
        h=h,
        statistic="excess failure rate speculative-only − baseline-only",
        judged=excess_bounds,
        note=f"; speculative-only {speculative_only}, baseline-only {baseline_only} of {n}; "
        f"{both_failed} pairs where both arms failed left out",
    )
    healthy_baseline = [r for r in judged if r.baseline.ok]
    ceiling = rate_check(
        f"{NAME}.ceiling",
        config,
        window,
        now,
        hits=[not r.speculative.ok for r in healthy_baseline],
        tolerance=config.max_error_rate,
        p0=config.max_error_rate,
        p1=rate_alternatives(
            config.max_error_rate, min(config.alarm_factor * config.max_error_rate, 0.99)
        ),
        h=h,
        statistic="speculative error rate where the baseline succeeded",
    )
    return combined(NAME, config, window, now, [paired, ceiling])


def paired_difference_bounds(
    first_only: int, second_only: int, n: int, confidence: float
) -> tuple[float, float]:
    """One-sided lower and upper bounds, each at `confidence`, on P(first only) −
    P(second only) from n pairs (Bonett & Price 2012, adjusted Wald for paired data:
    p̃ = (count + 1) / (n + 2) for each discordant cell, var = (p̃1 + p̃2 − (p̃1 − p̃2)²)
    / (n + 2)); clipped to [−1, 1]."""
    if n <= 0:
        return -1.0, 1.0
    p1 = (first_only + 1) / (n + 2)
    p2 = (second_only + 1) / (n + 2)
    difference = p1 - p2
    half = float(norm.ppf(confidence)) * math.sqrt(max(p1 + p2 - difference**2, 0.0) / (n + 2))
    return max(difference - half, -1.0), min(difference + half, 1.0)
