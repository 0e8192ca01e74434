"""The acceptance-drift gate: has a category's acceptance length fallen below its reference?

Per category, the window's acceptance lengths (output tokens per verify step,
speculative arm), oldest first, feed two Gaussian likelihood-ratio CUSUMs (a bank,
gates/sequential.py): N(μ0 × (1 − `max_relative_drop`), σ²) against N(μ0, σ²) on the
lengths, where μ0 is the reference mean, for the smallest drop that matters; and a drop
of twice that on log(length) against the reference's log mean and log sd (a gross drop
is caught at its own chart's speed; the bank's threshold pays log 2 for the second
chart). Each sd is the reference's 95 % chi-square upper bound (floored), so an
uncertain reference makes the detector more cautious, not less. The drift gate's share
of the false-alarm budget is split between the monitored categories by their share of
the pairs. A category PASSes when its mean's lower t bound excludes the relevant drop.

References are pinned per category from a healthy period (`pin_reference`, at least
`pin_min_samples` pairs) under the current arms configuration, or configured. A category
with pairs in the window but no reference is unmonitored: it is named, and it keeps the
gate INCONCLUSIVE (never a silent PASS) until it is pinned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from scipy.stats import chi2

from gates.budget import DEFAULT_ARL0
from gates.config import DriftGateConfig
from gates.core import GateDecision, GateState
from gates.detectors import CALIBRATION_CONFIDENCE, cusum_note, reading, sequential_state
from gates.records import PairRecord
from gates.sequential import cusum_bank, gaussian_llr, lorden_threshold
from gates.stats import mean_t_bounds
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


@dataclass(frozen=True, slots=True)
class ReferenceStats:
    """A category's healthy acceptance length: mean and sd per pair, from n pairs."""

    mean: float
    sd: float
    n: int = 0
    # The same over log(acceptance length), where a proportional drop is a plain shift;
    # None for references configured or pinned without them.
    log_mean: float | None = None
    log_sd: float | None = None


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
    records: Sequence[PairRecord], *, min_samples: int = DEFAULT_PIN_MIN_SAMPLES
) -> dict[str, ReferenceStats]:
    """Per category, the mean and sd of the acceptance length over `records` (a healthy
    period); categories with fewer than `min_samples` measured pairs are left out."""
    pinned: dict[str, ReferenceStats] = {}
    for category, values in sorted(acceptance_lengths(records).items()):
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


_MIN_LOG_SD = 0.05


def _chi2_factor(n: int, confidence: float) -> float:
    if n < 2:
        return 1.0
    return math.sqrt((n - 1) / float(chi2.ppf(1.0 - confidence, n - 1)))


def cautious_sd(reference: ReferenceStats, confidence: float, floor_fraction: float) -> float:
    """The reference sd's upper chi-square bound (when n is known), floored."""
    return max(
        reference.sd * _chi2_factor(reference.n, confidence), floor_fraction * reference.mean
    )


def drift_gate(
    records: Sequence[PairRecord],
    config: DriftGateConfig,
    *,
    now: datetime,
    references: Mapping[str, ReferenceStats] | None = None,
    arl0: float = DEFAULT_ARL0,
    since: datetime | None = None,
) -> GateDecision:
    """Configured references override pinned ones; the decision names drifted categories."""
    window = select(records, config, now, since)
    merged: dict[str, ReferenceStats] = dict(references or {})
    merged.update({c: ReferenceStats(r.mean, r.sd) for c, r in config.references.items()})
    by_category = acceptance_lengths(window.records)
    monitored = {c: v for c, v in by_category.items() if c in merged}
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
        components.append(_category(config, window, now, category, values, reference, h))
    if not components:
        return _nodata(config, window, now, "no measured acceptance lengths in the window")
    components.sort(key=lambda item: -item[0])  # largest drop first: it is the evidence shown
    decisions = [d for _, d in components]
    result = combined(NAME, config, window, now, decisions)
    unmonitored = [d.categories[0] for d in decisions if d.state is GateState.NODATA]
    flagged = tuple(
        sorted(d.categories[0] for d in decisions if d.state is result.state and d.categories)
    )
    if result.state in (GateState.FAIL, GateState.WARN):
        result = combined(NAME, config, window, now, decisions, categories=flagged)
    elif unmonitored:
        note = f"unmonitored categories (no reference yet): {', '.join(sorted(unmonitored))}"
        result = combined(NAME, config, window, now, decisions, [note])
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
) -> tuple[float, GateDecision]:
    sigma = cautious_sd(reference, CALIBRATION_CONFIDENCE, config.sd_floor_fraction)
    mu0 = reference.mean
    mu1 = mu0 * (1.0 - config.max_relative_drop)
    drops = _chart_drops(config.max_relative_drop)
    charts = [gaussian_llr(values, mu0, mu0 * (1.0 - drops[0]), sigma)]
    if reference.log_mean is not None and reference.log_sd is not None:
        log_sigma = max(
            reference.log_sd * _chi2_factor(reference.n, CALIBRATION_CONFIDENCE), _MIN_LOG_SD
        )
        logs = [math.log(max(v, 1e-9)) for v in values]
        m0 = reference.log_mean
        charts.append(gaussian_llr(logs, m0, m0 + math.log(1.0 - drops[-1]), log_sigma))
    else:
        charts.append(gaussian_llr(values, mu0, mu0 * (1.0 - drops[-1]), sigma))
    cusum, chart, h = cusum_bank(charts, h)
    n = len(values)
    mean, mean_lower, mean_upper = mean_t_bounds(values, config.confidence)
    drop = 1.0 - mean / mu0
    state = sequential_state(
        cusum,
        h,
        n,
        config.min_samples,
        passed=mean_lower >= mu1,
        warned=drop >= config.max_relative_drop,
    )
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
        detail=f"{category}: acceptance length {mean:.3f} vs reference {mu0:.3f} "
        f"(drop {drop:.1%}, relevant {config.max_relative_drop:.0%}); "
        f"{cusum_note(cusum, h)} for mean {mu0:.3f} → {mu0 * (1.0 - drops[chart]):.3f} "
        f"(chart {chart + 1} of {len(charts)}), sd {sigma:.3f}",
        categories=(category,) if state is not GateState.PASS else (),
        category=category,
        detector=reading(cusum, h),
    )
