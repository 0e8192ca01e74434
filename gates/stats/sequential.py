"""Sequential change detection: likelihood-ratio CUSUMs, their banks, and the threshold
that holds each to its share of the false-alarm budget.

The detector is recomputed from the ordered window of observations on every evaluation
(no hidden state): a restart, a second daemon or an auditor replaying the stored records
gets exactly the same statistic. Starting at zero at the window's first record makes the
windowed CUSUM never larger than one run over the whole history, so the false-alarm
rate can only go down; with a window far longer than the detection delay (tens of
samples) the sensitivity is the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scipy.stats import chi2

# --- likelihood-ratio CUSUM and the false-alarm budget ----------------------------------
#
# Every enforce gate's FAIL is the alarm of a CUSUM on per-pair log-likelihood ratios
# (Page's CUSUM): S_t = max(0, S_{t−1} + log f1(x_t)/f0(x_t)), alarm when S_t ≥ h. f0 is the
# in-control model at the edge of what is acceptable and f1 the smallest change that
# matters, so the minimum relevant effect is inside the statistic: data between the two
# push S down as often as up. For such a CUSUM Lorden (1971) bounds the in-control
# average run length from below by e^h whatever the data, so h = log(ARL0) spends at
# most the detector's share of the false-alarm budget — a bound, not an approximation.


@dataclass(frozen=True, slots=True)
class LlrCusum:
    statistic: float  # S at the last observation
    peak: float  # the largest S in the run
    alarm_index: int | None  # the first observation at which S reached h (None: never)
    change_index: int | None  # where the excursion holding the peak began
    observations: int


def llr_cusum(increments: Sequence[float], h: float) -> LlrCusum:
    """The upper CUSUM of log-likelihood-ratio `increments`, with its first alarm at `h`."""
    statistic = peak = 0.0
    start: int | None = None
    peak_start: int | None = None
    alarm: int | None = None
    for index, increment in enumerate(increments):
        if statistic == 0.0:
            start = index
        statistic = max(0.0, statistic + increment)
        if statistic == 0.0:
            start = None
        if statistic > peak:
            peak, peak_start = statistic, start
        if alarm is None and statistic >= h:
            alarm = index
    return LlrCusum(statistic, peak, alarm, peak_start, len(increments))


def bernoulli_llr(p0: float, p1: float) -> tuple[float, float]:
    """(log-LR of a hit, log-LR of a miss) for Bernoulli(p1) against Bernoulli(p0)."""
    if not 0.0 < p0 < p1 < 1.0:
        raise ValueError(f"need 0 < p0 < p1 < 1, got p0={p0!r}, p1={p1!r}")
    return math.log(p1 / p0), math.log((1.0 - p1) / (1.0 - p0))


def gaussian_llr(values: Sequence[float], mu0: float, mu1: float, sigma: float) -> list[float]:
    """Per-value log-LR of N(mu1, sigma²) against N(mu0, sigma²)."""
    if sigma <= 0.0:
        raise ValueError(f"sigma must be positive, got {sigma!r}")
    scale = (mu1 - mu0) / (sigma * sigma)
    middle = (mu0 + mu1) / 2.0
    return [scale * (v - middle) for v in values]


def lorden_threshold(arl0: float) -> float:
    """The threshold h = log(ARL0) that guarantees an in-control ARL of at least `arl0`."""
    return math.log(max(arl0, 1.0))


def cusum_bank(charts: Sequence[Sequence[float]], h: float) -> tuple[LlrCusum, int, float]:
    """Several CUSUMs of the same data tuned to different changes (a multi-chart CUSUM):
    each runs at h + log(len(charts)), so by the union bound the bank spends no more of
    the budget than one chart at h, and the chart nearest the real change alarms almost
    as early as an oracle tuned to it. Returns the chart with the largest share of its
    threshold, its index and the bank's threshold. The chart returned carries the bank's
    peak and first alarm (the largest peak and the earliest alarm of any chart: every
    chart runs at the same threshold), so a chart that alarmed and has since fallen
    back is never hidden behind the one that is highest now."""
    if not charts:
        raise ValueError("a CUSUM bank needs at least one chart")
    bank_h = h + math.log(len(charts))
    runs = [llr_cusum(increments, bank_h) for increments in charts]
    index = max(range(len(runs)), key=lambda i: (runs[i].statistic, runs[i].peak))
    return bank_of(runs, runs[index]), index, bank_h


def bank_of(runs: Sequence[LlrCusum], shown: LlrCusum) -> LlrCusum:
    """`shown` with the largest peak and the earliest alarm of `runs` (charts that share
    one threshold)."""
    alarms = [r.alarm_index for r in runs if r.alarm_index is not None]
    return replace(
        shown, peak=max(r.peak for r in runs), alarm_index=min(alarms) if alarms else None
    )


# --- gross shifts: a ladder of Gaussian charts ------------------------------------------
#
# A chart tuned next to the tolerance (edge → edge + Δ) earns about Δ²/2σ² of evidence per
# pair whatever the real shift, so an effect forty times the tolerance takes as many
# pairs as one twice it. A ladder of charts at Δ, 4Δ, 16Δ, … (a bank, so it spends no
# more of the budget than one chart) lets the chart nearest the real shift decide. A gross
# chart's scale is at least its shift / GROSS_SEPARATION: evidence per pair then stays
# below GROSS_SEPARATION²/2 + 3·GROSS_SEPARATION (with the usual 3-scale clip), so no
# single pair alarms however wild, and a larger scale than the data's only makes the chart
# conservative (E₀[e^increment] ≤ 1 for any true sd up to the chart's).

GROSS_LADDER = 4.0  # each chart's shift is this many times the previous one's
GROSS_SEPARATION = 3.0  # a chart's shift is at most this many of its scales
GROSS_MIN_VALUES = 3  # gross charts start at the third pair of a window


def shift_ladder(smallest: float, largest: float) -> list[float]:
    """Shifts `smallest` × 4^k (k = 0, 1, …) up to `largest` (the first always)."""
    if smallest <= 0.0:
        raise ValueError(f"the smallest shift must be positive, got {smallest!r}")
    shifts = [smallest]
    while shifts[-1] * GROSS_LADDER <= largest and len(shifts) < 8:
        shifts.append(shifts[-1] * GROSS_LADDER)
    return shifts


def sd_upper_bound(values: Sequence[float], confidence: float) -> float:
    """The one-sided upper confidence bound on the sd of `values` (χ², n − 1 degrees of
    freedom); infinite for fewer than GROSS_MIN_VALUES values, so that a chart at this
    scale gathers no evidence from them: one value says nothing of the spread, and two
    equal ones (a task check lost twice: scores are 0 or 1) would claim none."""
    n = len(values)
    if n < GROSS_MIN_VALUES:
        return math.inf
    mean = math.fsum(values) / n
    squares = math.fsum((v - mean) ** 2 for v in values)
    return math.sqrt(squares / float(chi2.ppf(1.0 - confidence, n - 1)))


def gross_charts(
    values: Sequence[float],
    mu0: float,
    shifts: Sequence[float],
    sigma: float,
    *,
    clip_sds: float = 3.0,
) -> list[list[float]]:
    """The increments of one gross Gaussian chart per signed shift: N(mu0 + shift) against
    N(mu0), at the scale max(`sigma`, |shift| / GROSS_SEPARATION), values clipped
    `clip_sds` scales outside the two means."""
    charts = []
    for shift in shifts:
        mu1 = mu0 + shift
        scale = max(sigma, abs(shift) / GROSS_SEPARATION)
        low, high = min(mu0, mu1) - clip_sds * scale, max(mu0, mu1) + clip_sds * scale
        clipped = [min(max(v, low), high) for v in values]
        charts.append(gaussian_llr(clipped, mu0, mu1, scale))
    return charts
