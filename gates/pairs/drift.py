"""The acceptance-drift gate: has a category's acceptance length fallen below its reference?

Per category, the window's acceptance lengths (output tokens per verify step,
speculative arm), oldest first, feed two Gaussian likelihood-ratio CUSUMs (a bank,
gates/stats/sequential.py): N(m0 − `max_relative_drop` × μ̂, σ²) against N(m0, σ²) on the
lengths, for the smallest drop that matters; and a drop of twice that on
log(length) (a gross drop is caught at its own chart's speed; the bank's threshold pays
log 2 for the second chart). Each sd is the reference's 95 % chi-square upper bound
(floored), so an uncertain reference makes the detector more cautious, not less.

A pinned reference's mean is an estimate too, and an error in it is not noise that
averages out: it biases every increment of the chart for as long as the pin lives, so a
pin drawn a little high false-alarms again and again. So on each scale the chart's
in-control mean m0 is the pinned mean less a margin (`pin_margin`) that leaves the
category at most half its share of the false-alarm budget over 30 days (`pin_alpha`),
averaged over the pin's error. A pin also tightens as pairs come in: it is pinned from
`pin_min_samples` pairs and grown from the category's earliest pairs under the current
arms until `pin_target_samples` (`grow_references`), so the margin shrinks from about
17 % of the mean at 30 pairs to about 4 % at 200 (a CV of 0.30). The drift gate's
share of the false-alarm budget is split between the monitored categories by their
share of the pairs. A category PASSes when the lower bound of its mean minus the
reference's at (1 − `max_relative_drop`), both uncertainties counted (Welch), is above
zero.

References are pinned per category from a healthy period (`pin_reference`, at least
`pin_min_samples` pairs) under the current arms configuration, or configured (taken as
exact: no margin). A category with pairs in the window but no reference is
unmonitored: it is named, and it keeps the gate INCONCLUSIVE (never a silent PASS)
until it is pinned.

With live traffic beside the suites, a FAIL or WARN names its cause in the evidence
(gates/pairs/attribution.py): an engine change when a control (suite) category dropped too; a
traffic change when the controls held and the live mix moved, in which case the live
categories only WARN (the speedup gate judges whether speculation still pays).

The fallback rate (verify steps that kept no draft token) is pinned beside each category's
acceptance reference and judged as a WARN-only signal (gates/pairs/drift_fallback.py): it takes
no share of the budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import log_ndtr, ndtr
from scipy.stats import chi2
from scipy.stats import t as t_dist

from gates.config import DriftGateConfig
from gates.core import GateDecision, GateState, ReferenceStats
from gates.pairs.attribution import attribute_drift
from gates.pairs.drift_fallback import fallback_key, fallback_rates, fallback_warnings, pin_fallback
from gates.records import PairRecord
from gates.stats.descriptive import mean_t_bounds
from gates.stats.detectors import CALIBRATION_CONFIDENCE, cusum_note, reading, sequential_state
from gates.stats.sequential import cusum_bank, gaussian_llr, lorden_threshold
from gates.window import Window, combined, decision, nodata, select

NAME = "drift"
DEFAULT_PIN_MIN_SAMPLES = 30
# The bank's charts, as multiples of the relevant drop: the smallest drop that matters,
# on the acceptance length itself, and a gross one on log(acceptance length) — where a
# proportional drop is a plain shift and the spread stays put, so it carries the evidence
# a narrower distribution gives without modelling the spread. Both log-LRs are linear in
# the observation, so a skewed, bounded-below distribution (mass piled near one token
# per step) cannot pass for a drop; a chart that also shrank the sd did, and
# false-alarmed on healthy measured traffic.
_CHART_MULTIPLES = (1.0, 2.0)


def _chart_drops(relevant: float) -> list[float]:
    drops = [min(relevant * m, 0.9) for m in _CHART_MULTIPLES]
    return sorted(set(drops))


def acceptance_lengths(records: Sequence[PairRecord]) -> dict[str, list[float]]:
    """Per category, the speculative arm's acceptance lengths, in record order."""
    by_category: dict[str, list[float]] = {}
    for record in records:
        if not record.speculative.ok:
            continue
        length = record.speculative.acceptance_length
        if length is not None and math.isfinite(length):
            by_category.setdefault(record.prompt.category, []).append(length)
    return by_category


def pin_reference(
    records: Sequence[PairRecord],
    *,
    min_samples: int = DEFAULT_PIN_MIN_SAMPLES,
    max_samples: int | None = None,
) -> dict[str, ReferenceStats]:
    """Per category, the mean and sd of the acceptance length over `records` (a healthy
    period, oldest first), from at most its first `max_samples` measured pairs;
    categories with fewer than `min_samples` measured pairs are left out."""
    pinned: dict[str, ReferenceStats] = {}
    for category, measured in sorted(acceptance_lengths(records).items()):
        values = measured[:max_samples] if max_samples is not None else measured
        if len(values) < max(2, min_samples):
            continue
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        logs = [math.log(v) for v in values if v > 0]
        log_mean = sum(logs) / len(logs)
        log_variance = sum((v - log_mean) ** 2 for v in logs) / (len(logs) - 1)
        pinned[category] = ReferenceStats(
            mean=mean,
            sd=math.sqrt(variance),
            n=len(values),
            log_mean=log_mean,
            log_sd=math.sqrt(log_variance),
        )
    return pinned


def grow_references(
    records: Sequence[PairRecord],
    references: Mapping[str, ReferenceStats],
    config: DriftGateConfig,
    *,
    now: datetime,
    arl0: float,
    budget_30d: float,
) -> dict[str, ReferenceStats]:
    """The pins to store now: categories in `records` (oldest first, healthy traffic
    under the current arms) without a reference, pinned from `pin_min_samples` pairs,
    and pins with fewer than `pin_target_samples` pairs grown from the category's
    earliest pairs — but never while the category's own check (`drift_gate` at the
    shares `arl0` and `budget_30d`) is WARN or FAIL against the pin it has (a drift
    that began while the pin grows must not pull it down). Each
    category pinned gets its fallback pin (`gates.pairs.drift_fallback.pin_fallback`) from the
    same pairs, replacing the one it had; a pinned category without one (pinned before
    fallback pins, or before its engine reported acceptance per position) gets it from
    its earliest pairs in `records`, under the same rule."""
    target = config.pin_target_samples
    measured = acceptance_lengths(records)
    growing = [
        c
        for c, r in references.items()
        if 0 < r.n < target and len(measured.get(c, ())) > r.n and c not in config.references
    ]
    missing = [c for c in measured if c not in references]
    unfallen = [
        c
        for c, values in fallback_rates(records).items()
        if c in references
        and c not in config.references
        and fallback_key(c) not in references
        and len(values) >= config.pin_min_samples
    ]
    if not growing and not missing and not unfallen:
        return {}
    if growing or unfallen:
        current = drift_gate(
            records, config, now=now, references=references, arl0=arl0, budget_30d=budget_30d
        )
        alarming = {
            d.category
            for d in current.components or (current,)
            if d.category is not None and d.state in (GateState.WARN, GateState.FAIL)
        }
        growing = [c for c in growing if c not in alarming]
        unfallen = [c for c in unfallen if c not in alarming]
    wanted = set(growing) | set(missing)
    pinned = pin_reference(
        [r for r in records if r.prompt.category in wanted],
        min_samples=config.pin_min_samples,
        max_samples=target,
    )
    chosen = {c: r for c, r in pinned.items() if c not in references or r.n > references[c].n}
    refallen = set(chosen) | set(unfallen)
    fallback = pin_fallback(
        [r for r in records if r.prompt.category in refallen],
        refallen,
        min_samples=config.pin_min_samples,
        max_samples=target,
    )
    return {**chosen, **fallback}


_MIN_LOG_SD = 0.05
FloatArray = NDArray[np.float64]


def pin_alpha(budget_30d: float, categories: int) -> float:
    """The chance a pinned mean may stand above the healthy mean, beyond its margin: half
    of one category's share of the drift gate's false alarms per 30 days."""
    return min(0.25, budget_30d / max(categories, 1) / 2.0)


@dataclass(frozen=True, slots=True)
class DriftChart:
    """One chart of a category's bank: N(m1, σ²) against N(m0, σ²) on the acceptance
    length, or on its log when `log`."""

    log: bool
    m0: float
    m1: float
    sigma: float

    def increments(self, values: Sequence[float]) -> list[float]:
        data = [math.log(max(v, 1e-9)) for v in values] if self.log else list(values)
        return gaussian_llr(data, self.m0, self.m1, self.sigma)


def pin_margin(
    se: ArrayLike, inflation: ArrayLike, shift: ArrayLike, h: float, horizon: float, alpha: float
) -> FloatArray:
    """How far below a pinned mean (on one chart's scale) the chart must start so that
    the pin's own error leaves at most `alpha` chance of a false alarm within `horizon`
    pairs. The pinned mean errs by b ~ N(0, se²). A Gaussian chart for a shift `shift`
    whose scale is `inflation` × the healthy sd, started m below the pinned mean, sees a
    bias b − m; its in-control run length is then about exp(h θ) with θ = inflation² ×
    (1 − 2 (b − m) / shift) (the root of E[exp(θ × increment)] = 1), so the chance of an
    alarm within the horizon is about min(1, horizon × exp(−h θ)): averaged over b in
    closed form, and m found by bisection. Element-wise over arrays (the benchmark draws
    thousands of pins at once); 0 where se or shift is 0."""
    se_, inflation_, shift_ = np.broadcast_arrays(
        np.asarray(se, dtype=float),
        np.asarray(inflation, dtype=float),
        np.asarray(shift, dtype=float),
    )
    live = (se_ > 0.0) & (shift_ > 0.0)
    se_ = np.where(live, se_, 1.0)
    shift_ = np.where(live, shift_, 1.0)
    k = 2.0 * h * inflation_**2 / shift_
    a = math.log(max(horizon, 1.0)) - h * inflation_**2
    edge = -a / k  # the bias at which an alarm within the horizon is expected

    def false_alarm(m: FloatArray) -> FloatArray:
        centre = -m
        # ndtr(-z) is norm.sf(z) (how scipy computes it) without the distribution
        # object's argument checks, which cost ~90 % of a gate run's pin margins.
        tail = ndtr(-(edge - centre) / se_)
        log_body = a + k * centre + (k * se_) ** 2 / 2.0
        log_body = log_body + log_ndtr((edge - centre - k * se_ * se_) / se_)
        return np.asarray(tail + np.exp(np.minimum(log_body, 0.0)), dtype=float)

    low = np.zeros_like(se_)
    high = 12.0 * se_ + shift_
    for _ in range(60):
        middle = (low + high) / 2.0
        over = false_alarm(middle) > alpha
        low, high = np.where(over, middle, low), np.where(over, high, middle)
    needed = live & (false_alarm(np.zeros_like(se_)) > alpha)
    return np.where(needed, high, 0.0)


def chart_parameters(
    mean: ArrayLike,
    sd: ArrayLike,
    n: ArrayLike,
    log_mean: ArrayLike,
    log_sd: ArrayLike,
    config: DriftGateConfig,
    *,
    alpha: float,
    h: float,
    horizon: float,
) -> tuple[tuple[FloatArray, FloatArray, FloatArray], tuple[FloatArray, FloatArray, FloatArray]]:
    """(m0, m1, σ) of the linear chart and of the log chart for references with these
    statistics, element-wise: on each scale the in-control mean is the pinned mean less
    its `pin_margin` (each chart spends half of `alpha`); n < 2 (a configured reference)
    is taken as exact."""
    mean_, sd_, n_ = (np.asarray(x, dtype=float) for x in (mean, sd, n))
    log_mean_, log_sd_ = np.asarray(log_mean, dtype=float), np.asarray(log_sd, dtype=float)
    drops = _chart_drops(config.max_relative_drop)
    pinned = n_ >= 2
    safe_n = np.where(pinned, n_, 2.0)
    factor = np.where(
        pinned, np.sqrt((safe_n - 1) / chi2.ppf(1.0 - CALIBRATION_CONFIDENCE, safe_n - 1)), 1.0
    )
    sigma = np.maximum(sd_ * factor, config.sd_floor_fraction * mean_)
    # The mean's standard error from the cautious sd: a pin drawn high is often also
    # drawn narrow (fewer values at the floor of one token per verify step).
    se = np.where(pinned, sigma / np.sqrt(safe_n), 0.0)
    shift = mean_ * drops[0]
    inflation = np.where(sd_ > 0, sigma / np.where(sd_ > 0, sd_, 1.0), 1.0)
    m0 = mean_ - pin_margin(se, inflation, shift, h, horizon, alpha / 2.0)
    log_sigma = np.maximum(log_sd_ * factor, _MIN_LOG_SD)
    log_se = np.where(pinned, log_sigma / np.sqrt(safe_n), 0.0)
    log_shift = -math.log(1.0 - drops[-1])
    log_inflation = np.where(log_sd_ > 0, log_sigma / np.where(log_sd_ > 0, log_sd_, 1.0), 1.0)
    log_m0 = log_mean_ - pin_margin(log_se, log_inflation, log_shift, h, horizon, alpha / 2.0)
    return (m0, m0 - shift, sigma), (log_m0, log_m0 - log_shift, log_sigma)


def drift_charts(
    reference: ReferenceStats,
    config: DriftGateConfig,
    *,
    alpha: float,
    h: float,
    horizon: float,
) -> tuple[DriftChart, ...]:
    """The category's bank against `reference` (`chart_parameters`); references without
    log statistics get a linear chart for the gross drop instead."""
    log_mean, log_sd = reference.log_mean, reference.log_sd
    has_log = log_mean is not None and log_sd is not None
    linear, log = chart_parameters(
        reference.mean,
        reference.sd,
        reference.n,
        log_mean if log_mean is not None else 0.0,
        log_sd if log_sd is not None else 0.0,
        config,
        alpha=alpha,
        h=h,
        horizon=horizon,
    )
    m0, m1, sigma = (float(x) for x in linear)
    charts = [DriftChart(False, m0, m1, sigma)]
    if has_log:
        charts.append(DriftChart(True, *(float(x) for x in log)))
    else:
        gross = reference.mean * _chart_drops(config.max_relative_drop)[-1]
        charts.append(DriftChart(False, m0, m0 - gross, sigma))
    return tuple(charts)


def drift_gate(
    records: Sequence[PairRecord],
    config: DriftGateConfig,
    *,
    now: datetime,
    references: Mapping[str, ReferenceStats] | None = None,
    arl0: float,
    budget_30d: float,
    since: datetime | None = None,
) -> GateDecision:
    """Configured references override pinned ones; the decision names drifted categories.
    `budget_30d` is the gate's share of the false-alarm budget (false rollbacks per 30
    days), of which each monitored category's pin may spend half (`pin_alpha`)."""
    window = select(records, config, now, since)
    merged: dict[str, ReferenceStats] = dict(references or {})
    merged.update({c: ReferenceStats(r.mean, r.sd) for c, r in config.references.items()})
    by_category = acceptance_lengths(window.records)
    monitored = {c: v for c, v in by_category.items() if c in merged}
    alpha = pin_alpha(budget_30d, len(monitored))
    total = sum(len(v) for v in monitored.values())
    components: list[tuple[float, GateDecision]] = []
    for category in sorted(by_category):
        values = by_category[category]
        reference = merged.get(category)
        if reference is None:
            empty = nodata(f"{NAME}.{category}", config, window, now, len(values))
            components.append(
                (
                    0.0,
                    decision(
                        f"{NAME}.{category}",
                        config,
                        window,
                        now,
                        state=GateState.NODATA,
                        n_speculative=len(values),
                        threshold=empty.threshold,
                        detail=f"{category}: unmonitored, no reference pinned yet "
                        f"({len(values)} pairs in the window)",
                        categories=(category,),
                        category=category,
                    ),
                )
            )
            continue
        share = len(values) / total
        category_arl0 = max(1.0, len(monitored) * share * arl0)
        h = lorden_threshold(category_arl0)
        # The category's pairs per 30 days at the design rate: arl0 × the detector's
        # budget is the design's pairs per 30 days (gates/stats/budget.py).
        horizon = share * arl0 * budget_30d
        components.append(
            _category(config, window, now, category, values, reference, h, alpha, horizon)
        )
    if not components:
        return _nodata(config, window, now, "no measured acceptance lengths in the window")
    components.sort(key=lambda item: -item[0])  # largest drop first: it is the evidence shown
    decisions = [d for _, d in components]
    decisions += fallback_warnings(
        [r for r in window.records if r.prompt.category in monitored],
        merged,
        config,
        window,
        now,
    )
    notes: list[str] = []
    dropped = {
        d.category
        for d in decisions
        if d.category is not None and d.state in (GateState.FAIL, GateState.WARN)
    }
    attribution = attribute_drift(window.records, dropped, monitored)
    if attribution is not None:
        notes.append(attribution.reason)
        if attribution.cause == "traffic":
            # A traffic change is not the arm's fault: its live categories WARN, and the
            # speedup gate judges whether speculation still pays on the new traffic.
            decisions = [
                replace(d, state=GateState.WARN)
                if d.state is GateState.FAIL and d.category in attribution.live
                else d
                for d in decisions
            ]
    result = combined(NAME, config, window, now, decisions, notes)
    unmonitored = [d.categories[0] for d in decisions if d.state is GateState.NODATA]
    flagged = tuple(
        sorted(d.categories[0] for d in decisions if d.state is result.state and d.categories)
    )
    if result.state in (GateState.FAIL, GateState.WARN):
        result = combined(NAME, config, window, now, decisions, notes, categories=flagged)
    elif unmonitored:
        note = f"unmonitored categories (no reference yet): {', '.join(sorted(unmonitored))}"
        result = combined(NAME, config, window, now, decisions, [*notes, note])
    return result


def _nodata(config: DriftGateConfig, window: Window, now: datetime, detail: str) -> GateDecision:
    empty = nodata(NAME, config, window, now, 0)
    return decision(
        NAME, config, window, now, state=empty.state, threshold=empty.threshold, detail=detail
    )


def _category(
    config: DriftGateConfig,
    window: Window,
    now: datetime,
    category: str,
    values: list[float],
    reference: ReferenceStats,
    h: float,
    alpha: float,
    horizon: float,
) -> tuple[float, GateDecision]:
    # The bank's threshold (h + log 2) is what the margin is designed against.
    bank = drift_charts(reference, config, alpha=alpha, h=h + math.log(2.0), horizon=horizon)
    cusum, chart, h = cusum_bank([c.increments(values) for c in bank], h)
    mu0 = reference.mean
    n = len(values)
    mean, mean_lower, mean_upper = mean_t_bounds(values, config.confidence)
    drop = 1.0 - mean / mu0
    state = sequential_state(
        cusum,
        h,
        n,
        config.min_samples,
        passed=_welch_lower(values, reference, config) >= 0.0,
        warned=drop >= config.max_relative_drop,
    )
    shown = bank[chart]
    chart_note = (
        f"log mean {shown.m0:.3f} → {shown.m1:.3f}, log sd {shown.sigma:.3f}"
        if shown.log
        else f"mean {shown.m0:.3f} → {shown.m1:.3f}, sd {shown.sigma:.3f}"
    )
    pinned = f", pinned from {reference.n} pairs" if reference.n else ""
    return drop, decision(
        f"{NAME}.{category}",
        config,
        window,
        now,
        state=state,
        statistic="relative drop of mean acceptance length vs reference",
        n_speculative=n,
        estimate=drop,
        lower=1.0 - mean_upper / mu0 if math.isfinite(mean_upper) else None,
        upper=1.0 - mean_lower / mu0 if math.isfinite(mean_lower) else None,
        threshold=config.max_relative_drop,
        detail=f"{category}: acceptance length {mean:.3f} vs reference {mu0:.3f}{pinned} "
        f"(drop {drop:.1%}, relevant {config.max_relative_drop:.0%}); "
        f"{cusum_note(cusum, h)} for {chart_note} (chart {chart + 1} of {len(bank)})",
        categories=(category,) if state is not GateState.PASS else (),
        category=category,
        detector=reading(cusum, h),
    )


def _welch_lower(
    values: Sequence[float], reference: ReferenceStats, config: DriftGateConfig
) -> float:
    """The lower `confidence` bound of mean(values) − (1 − `max_relative_drop`) × the
    reference mean, counting the reference's own uncertainty (none when configured)."""
    n = len(values)
    if n < 2:
        return -math.inf
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) / n
    keep = 1.0 - config.max_relative_drop
    if reference.n >= 2:
        variance += (keep * reference.sd) ** 2 / reference.n
    quantile = float(t_dist.ppf(config.confidence, n - 1))
    return mean - keep * reference.mean - quantile * math.sqrt(variance)
