"""The error-rate gate: is the speculative arm failing more often than the baseline?

Two detectors on the window's pairs, oldest first. Pairs that say nothing about the
speculative arm are left out of both:
- pairs where both arms failed;
- pairs in a **shared outage**: from the first to the last baseline failure of a
  cluster, and `outage_margin_pairs` on each side; a cluster is a span (of
  `outage_spans` consecutive pairs) in which the baseline failed so often that a calm
  baseline, failing at its window rate (its upper bound), would do so with probability at
  most `outage_alpha`. A burst of errors that hits both arms (a gateway, a network, a
  shared node) makes each arm fail alone too; judged against the window-long rate, those
  pairs look like a speculative fault. The rule reads only the baseline, so under the
  null hypothesis it drops pairs independently of the speculative arm's outcome;
- the newest `settle_pairs` pairs: a pair is judged once the pairs after it show
  whether an outage was starting (a dead speculative arm is the liveness gate's job,
  which reads every pair at once).
The detectors:
- paired: a Bernoulli CUSUM on speculative-only failures. Its in-control rate p0 is the
  edge of what is tolerated: the upper confidence bound of the baseline-only failure
  rate in the same pairs (equal arms fail alone equally often) plus `max_excess_rate`;
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

from scipy.stats import binom, norm

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
    pairs = window.records
    if not pairs:
        return nodata(NAME, config, window, now, 0)
    baseline_failed = [not r.baseline.ok for r in pairs]
    _, calm_rate = clopper_pearson(sum(baseline_failed), len(pairs), CALIBRATION_CONFIDENCE)
    outage = shared_outages(
        baseline_failed,
        calm_rate,
        spans=config.outage_spans,
        alpha=config.outage_alpha,
        margin=config.outage_margin_pairs,
    )
    settled = max(len(pairs) - config.settle_pairs, 0)
    calm = [r for r, out in zip(pairs[:settled], outage[:settled], strict=True) if not out]
    judged = [r for r in calm if r.baseline.ok or r.speculative.ok]
    in_outage, both_failed = settled - len(calm), len(calm) - len(judged)
    if not judged:
        return nodata(NAME, config, window, now, 0)
    h = lorden_threshold(arl0)
    n = len(judged)
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
        f"left out: {both_failed} pairs where both arms failed, {in_outage} in shared "
        f"outages, the newest {len(pairs) - settled} not yet settled",
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


def shared_outages(
    baseline_failed: Sequence[bool],
    calm_rate: float,
    *,
    spans: Sequence[int],
    alpha: float,
    margin: int,
) -> list[bool]:
    """Which pairs lie in a shared outage: from the first to the last baseline failure of
    a cluster, and `margin` pairs on each side. A cluster is a span of n (each of
    `spans`) consecutive pairs in which the baseline failed at least k_n times, k_n the
    smallest count (at least 2) that a baseline failing at `calm_rate` reaches in n pairs
    with probability at most `alpha`. Reads the baseline only."""
    size = len(baseline_failed)
    rate = min(max(calm_rate, _RATE_FLOOR), 0.5)
    failures = [i for i, failed in enumerate(baseline_failed) if failed]
    marks = [0] * (size + 1)  # +1 where a left-out run starts, −1 where it ends
    for n in spans:
        k = next((k for k in range(2, n + 1) if binom.sf(k - 1, n, rate) <= alpha), None)
        if k is None:
            continue
        # k failures within n pairs: failures[j] .. failures[j + k − 1] span at most n
        for j in range(len(failures) - k + 1):
            first, last = failures[j], failures[j + k - 1]
            if last - first < n:
                marks[max(first - margin, 0)] += 1
                marks[min(last + 1 + margin, size)] -= 1
    out, depth = [], 0
    for i in range(size):
        depth += marks[i]
        out.append(depth > 0)
    return out
