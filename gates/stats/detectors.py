"""The two halves of every statistical check: a sequential detector that may FAIL, and a
fixed-sample bound that may PASS.

FAIL is the alarm of a likelihood-ratio CUSUM (gates/stats/sequential.py) run pair by pair over
the window, oldest first, with the detector's share of the false-alarm budget as its
threshold h: it needs no minimum sample, so overwhelming evidence decides at once, and
it is recomputed from the stored window on every evaluation, so a decision can be
replayed. PASS is positive evidence over the same window: a one-sided bound at the
gate's `confidence` on the right side of the tolerance, with at least `min_samples`.
Between the two: WARN when the detector is past half its threshold or the estimate is
past the tolerance, else INCONCLUSIVE; NODATA below `min_samples` (never a PASS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from gates.config_base import GateConfigBase
from gates.core import DetectorReading, GateDecision, GateState
from gates.stats.descriptive import clopper_pearson
from gates.stats.sequential import GROSS_LADDER, LlrCusum, bernoulli_llr, cusum_bank
from gates.window import Window, decision

# The level of the plug-in estimates a detector's in-control model rests on (the
# baseline's own rates, a reference sd). Fixed, and higher than the PASS `confidence`:
# a loose estimate here would spend more than the detector's share of the budget.
CALIBRATION_CONFIDENCE = 0.95


def sequential_state(
    cusum: LlrCusum, h: float, n: int, min_samples: int, passed: bool, warned: bool
) -> GateState:
    """The state from the detector (FAIL, WARN) and the bound (PASS) as described above."""
    if cusum.statistic >= h:
        return GateState.FAIL
    if cusum.statistic >= h / 2.0 or cusum.peak >= h:
        return GateState.WARN
    if n < min_samples:
        return GateState.NODATA
    if passed:
        return GateState.PASS
    return GateState.WARN if warned else GateState.INCONCLUSIVE


def reading(cusum: LlrCusum, h: float) -> DetectorReading:
    """The detector's figures for the decision (`GateDecision.detector`)."""
    return DetectorReading(statistic=cusum.statistic, peak=cusum.peak, threshold=h)


def closest(*charts: tuple[LlrCusum, float]) -> DetectorReading:
    """One reading for a check with several detectors at one threshold (each direction
    of a two-sided test): S of the one nearest the threshold, the largest peak of any."""
    readings = [reading(c, h) for c, h in charts]
    nearest = max(readings, key=lambda r: (r.progress, r.peak))
    return replace(nearest, peak=max(r.peak for r in readings))


def cusum_note(cusum: LlrCusum, h: float) -> str:
    change = (
        f", excursion from pair {cusum.change_index + 1}"
        if cusum.change_index is not None and cusum.peak > 0
        else ""
    )
    return f"CUSUM {cusum.statistic:.2f} (peak {cusum.peak:.2f}) vs h {h:.2f}{change}"


def bernoulli_increments(hits: Sequence[bool], p0: float, p1: float) -> list[float]:
    hit, miss = bernoulli_llr(p0, p1)
    return [hit if x else miss for x in hits]


GROSS_RATE = 0.9  # the largest alternative of a rate bank


def rate_alternatives(p0: float, first: float, charts: int = 3) -> list[float]:
    """A rate detector's bank: `first` (the alternative next to the edge p0) and gross
    ones at 4× and 16× it, capped at GROSS_RATE; only those above p0, each once."""
    ladder = {min(first * GROSS_LADDER**k, GROSS_RATE) for k in range(charts)}
    return sorted(p1 for p1 in ladder if p1 > p0)


def rate_check(
    name: str,
    config: GateConfigBase,
    window: Window,
    now: datetime,
    *,
    hits: Sequence[bool],
    tolerance: float,
    p0: float,
    p1: float | Sequence[float],
    h: float,
    statistic: str,
    note: str = "",
    judged: tuple[float, float, float] | None = None,
    **extra: Any,
) -> GateDecision:
    """A rate that must stay at or below `tolerance`: Bernoulli CUSUM of Bernoulli(p1)
    against Bernoulli(p0) for FAIL, the Clopper–Pearson upper bound for PASS — or, when
    the tolerance is on a statistic of its own, `judged` = (estimate, lower, upper) of it.
    Several alternatives `p1` make a bank (gates.stats.sequential.cusum_bank) at h + log of
    their number: the nearest to the real rate decides."""
    n = len(hits)
    count = sum(1 for x in hits if x)
    alternatives = [p1] if isinstance(p1, float | int) else list(p1)
    cusum, chart, h = cusum_bank([bernoulli_increments(hits, p0, a) for a in alternatives], h)
    rate = count / n if n else 0.0
    lower, upper = clopper_pearson(count, n, config.confidence) if n else (0.0, 1.0)
    estimate = rate
    if judged is not None:
        estimate, lower, upper = judged
    state = sequential_state(
        cusum,
        h,
        n,
        config.min_samples,
        passed=upper <= tolerance,
        warned=estimate > tolerance,
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic=statistic,
        n_baseline=n,
        n_speculative=n,
        estimate=estimate,
        lower=lower,
        upper=upper,
        threshold=tolerance,
        detail=f"{statistic} {estimate:.4f} (upper bound {upper:.4f}) vs max {tolerance:g}; "
        f"{count}/{n} hits, {cusum_note(cusum, h)} for p {p0:.4g} → "
        f"{alternatives[chart]:.4g}{note}",
        detector=reading(cusum, h),
        **extra,
    )
