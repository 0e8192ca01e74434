"""The latency gate: speculative vs baseline quantiles of e2e, TTFT, TPOT and ITL.

A metric's value per generation is its e2e, TTFT or TPOT, or for `itl` the generation's
own P99 gap between tokens (`InterTokenLatency.p99_s`): the stall a streaming reader
feels, which speculation's bursts raise while its mean (TPOT) falls. `itl` is judged
only when configured (`metrics`, `regression_metrics`, an SLO), like any other metric.

One decision for the gate, with one component per (metric, quantile) ratio and per
absolute SLO. Only pairs where both arms succeeded count: failures belong to the error
gate.

Per metric, a median component watches the whole distribution: a sign test of the
typical paired ratio. FAIL from a Bernoulli CUSUM on "this pair's ratio is above
`max_ratio`", 1/2 (a median ratio of exactly `max_ratio`) against `median_alarm_share`
and 0.9 (one bank); PASS when the median ratio's order-statistic upper bound is within
`max_ratio`. A slowdown of every request shows here long before a noisy,
stall-dominated tail can show it. Why a sign and not the log ratios themselves: a stall
(a GC pause, a preemption, a neighbour's batch on the host) hits one arm of a pair and
makes its ratio anything, and any statistic that weighs how far a pair is above the
tolerance lets a few stalled pairs decide. On arms whose ratios are tight a Gaussian
chart on the log ratios, scaled by their spread, gave one stalled pair 13.5 nats against
a threshold of about 18: two stalls alarmed, and a healthy arm with a median ratio of
0.63 was rolled back for 4 stalled pairs of 184. A sign is the median's own test: its
null holds exactly at the tolerance whatever the ratios' shape, it needs no scale, and
one vote is worth at most log(2 × 0.9) = 0.59 nats, so only a majority of the pairs
above `max_ratio` — the median having moved — can alarm. Clipping each pair's evidence to
a fraction of h instead would bound a minority's weight by that fraction, not by what
the median does. The price: a sign carries about 2/π of the evidence of the log ratios
under a log-normal core, and a gross slowdown needs about 31 votes (h / 0.59) to FAIL
instead of 3; the regression check (below) keeps the log ratios for the arm's change
against itself.

Pairs that ran at the same time (`gates.window.concurrent_groups`: a rollout burst's
`rollout.concurrency` pairs of one cycle, or several arms' records of one prompt) can
share one stall, which then hits all of them at once: they are one piece of evidence,
not several. The median component counts such a group as one vote (the majority of its
pairs; none on a tie), the tail detector as one vote (the side that exceeded alone in
more of its pairs) and the regression check as one value (its median). The daemon's
schedule starts a pair only after the one before ended, so there every group is one
pair and nothing changes.

FAIL also comes from a sequential detector on the tail, paired so that it needs no
estimate of either arm's quantile to be calibrated. A level L (the q-quantile of the
window's pooled values {`max_ratio` × baseline, speculative}) splits each pair into "the
speculative value exceeds L" and "`max_ratio` × the baseline value exceeds L". The gate's
tolerance (speculative q-quantile ≤ `max_ratio` × baseline q-quantile) means the first is
no likelier than the second, whatever L and however the arms of a pair correlate, so in a
pair where exactly one side exceeds, the speculative side does so with probability at
most 1/2. A Bernoulli CUSUM on those discordant pairs, 1/2 against `alarm_factor` /
(1 + `alarm_factor`) (the speculative arm exceeding `alarm_factor` times as often), alarms
only when the tail has really moved. An SLO's exceedances of its fixed `max_seconds` are
a plain Bernoulli CUSUM, (1 − q) against `alarm_factor` × (1 − q). Both wait for
2 / (1 − q) pairs.
PASS comes from the ratio's upper bound (a seeded paired bootstrap, pairs resampled
together) or the SLO's order-statistic bound at or below the limit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from scipy.stats import chi2, norm

from engine.types import GenerationResult
from gates.config import LatencyGateConfig, LatencyMetric
from gates.core import GateDecision, GateState
from gates.pairs.drift import pin_alpha, pin_margin
from gates.records import PairRecord
from gates.stats.descriptive import (
    order_statistic_bounds,
    paired_bootstrap_quantile_ratio,
    quantile,
)
from gates.stats.detectors import (
    CALIBRATION_CONFIDENCE,
    bernoulli_increments,
    cusum_note,
    rate_alternatives,
    reading,
    sequential_state,
)
from gates.stats.sequential import (
    GROSS_MIN_VALUES,
    GROSS_SEPARATION,
    LlrCusum,
    bernoulli_llr,
    cusum_bank,
    gaussian_llr,
    llr_cusum,
    lorden_threshold,
)
from gates.window import Window, combined, concurrent_groups, decision, nodata, select

NAME = "latency"
_MIN_LOG_SCALE = 0.02  # 2 % timing noise: below it, differences are clock resolution


def _metric(result: GenerationResult, metric: LatencyMetric) -> float | None:
    if metric == "itl":
        value = None if result.itl is None else result.itl.p99_s
    else:
        value = {"e2e": result.e2e_s, "ttft": result.ttft_s, "tpot": result.tpot_s}[metric]
    return value if value is not None and value > 0 else None


def _pct(q: float) -> str:
    return f"p{q * 100:g}"


def _exceedance(
    values: list[float], limit: float, q: float, factor: float, h: float
) -> LlrCusum | None:
    """Exceedances of a fixed limit: (1 − q) against `factor` × (1 − q), pair by pair."""
    if len(values) < math.ceil(2.0 / (1.0 - q)):
        return None
    p0 = 1.0 - q
    p1 = min(factor * p0, 0.99)
    return llr_cusum(bernoulli_increments([v > limit for v in values], p0, p1), h)


def _tail_discordance(
    paired: list[tuple[float, float]],
    groups: list[int],
    max_ratio: float,
    q: float,
    factor: float,
    h: float,
) -> tuple[LlrCusum | None, float]:
    """The paired tail detector described above, and its level L. A burst cycle's
    concurrent pairs cast one vote: the side that exceeded alone in more of them."""
    scaled = [(max_ratio * b, s) for b, s in paired]
    level = quantile([v for pair in scaled for v in pair], q)
    assert level is not None  # paired is non-empty
    if len(paired) < math.ceil(2.0 / (1.0 - q)):
        return None, level
    sides = [int(s > level) - int(b > level) for b, s in scaled]
    cycles = _cycles(groups)
    votes = _votes(sides, cycles)
    hit, miss = bernoulli_llr(0.5, factor / (1.0 + factor))
    increments = [hit if v > 0 else miss if v < 0 else 0.0 for v in votes]
    return _in_pairs(llr_cusum(increments, h), cycles), level


def _state(
    cusum: LlrCusum | None, h: float, n: int, min_samples: int, passed: bool, warned: bool
) -> GateState:
    if cusum is None:
        if n < min_samples:
            return GateState.NODATA
        return GateState.PASS if passed else GateState.WARN if warned else GateState.INCONCLUSIVE
    return sequential_state(cusum, h, n, min_samples, passed, warned)


def _cycles(groups: Sequence[int]) -> list[range]:
    """The index ranges of the pairs of each concurrent group (`groups` ascending)."""
    cycles: list[range] = []
    start = 0
    for index in range(1, len(groups) + 1):
        if index == len(groups) or groups[index] != groups[start]:
            cycles.append(range(start, index))
            start = index
    return cycles


def _votes(signs: Sequence[int], cycles: Sequence[range]) -> list[int]:
    """Each cycle's majority of `signs` (+1, −1 or 0 per pair): +1, −1, or 0 on a tie."""
    votes = []
    for cycle in cycles:
        total = sum(signs[i] for i in cycle)
        votes.append((total > 0) - (total < 0))
    return votes


def _in_pairs(cusum: LlrCusum, cycles: Sequence[range]) -> LlrCusum:
    """A CUSUM run over cycles with its indices in pairs: an excursion from the cycle's
    first pair, an alarm at its last."""
    return replace(
        cusum,
        change_index=None if cusum.change_index is None else cycles[cusum.change_index][0],
        alarm_index=None if cusum.alarm_index is None else cycles[cusum.alarm_index][-1],
        observations=sum(len(c) for c in cycles),
    )


def latency_gate(
    records: Sequence[PairRecord],
    config: LatencyGateConfig,
    *,
    now: datetime,
    arl0: float,
    budget_30d: float,
    since: datetime | None = None,
) -> GateDecision:
    """FAIL when a tail-exceedance detector alarms; PASS when every ratio's and SLO's
    upper bound is within its limit. `budget_30d` is a detector's share of the budget
    (false rollbacks per 30 days): the regression check's pin may spend half of it."""
    window = select(records, config, now, since)
    complete = [r for r in window.records if r.complete]
    if not complete:
        return nodata(NAME, config, window, now, 0)
    h = lorden_threshold(arl0)
    cycles = concurrent_groups(complete)
    components: list[GateDecision] = []
    skipped: list[str] = []
    for metric in config.metrics:
        timed = [
            (b, s, cycle)
            for r, cycle in zip(complete, cycles, strict=True)
            if (b := _metric(r.baseline, metric)) is not None
            and (s := _metric(r.speculative, metric)) is not None
        ]
        if not timed:
            skipped.append(f"{metric} not reported")
            continue
        paired = [(b, s) for b, s, _ in timed]
        groups = [cycle for _, _, cycle in timed]
        components.append(_median(config, window, now, metric, paired, groups, h))
        for q in config.quantiles:
            components.append(_ratio(config, window, now, metric, q, paired, groups, h))
        if metric in config.regression_metrics:
            regression = _regression(config, window, now, metric, paired, groups, h, budget_30d)
            if isinstance(regression, str):
                skipped.append(regression)
            elif regression.state is GateState.NODATA:
                # Too few pairs after the pin to PASS: a note, so that the pin's own wait
                # (regression_pin_pairs + min_samples after every transition) never holds
                # a restore back; its detector still FAILs (or WARNs) as soon as it alarms.
                skipped.append(regression.detail)
            else:
                components.append(regression)
    for slo in config.slos:
        values = [v for r in complete if (v := _metric(r.speculative, slo.metric)) is not None]
        if not values:
            skipped.append(f"{slo.metric} SLO: not reported")
            continue
        components.append(
            _slo(config, window, now, slo.metric, slo.quantile, slo.max_seconds, values, h)
        )
    if not components:
        return nodata(NAME, config, window, now, 0)
    return combined(NAME, config, window, now, components, skipped)


def _median(
    config: LatencyGateConfig,
    window: Window,
    now: datetime,
    metric: LatencyMetric,
    paired: list[tuple[float, float]],
    groups: list[int],
    h: float,
) -> GateDecision:
    """The whole distribution shifted: a sign test of the typical ratio. At a median
    paired ratio of exactly `max_ratio` a pair is above it with probability 1/2, whatever
    the shape of the ratios' distribution, so a Bernoulli CUSUM of `median_alarm_share`
    (and 0.9, a gross chart, in one bank) against 1/2 on "above `max_ratio`" is
    calibrated with no scale to estimate. A burst cycle's concurrent pairs cast one vote,
    their majority (none on a tie). One vote moves the statistic by log(2 × 0.9) = 0.59
    nats at most, so no minority of stalled pairs or cycles can alarm: it takes about
    h / 0.59 ≈ 31 votes in a row above `max_ratio`."""
    name = f"{NAME}.{metric}.median"
    n = len(paired)
    ratios = [s / b for b, s in paired]
    cycles = _cycles(groups)
    votes = _votes([1 if r > config.max_ratio else -1 for r in ratios], cycles)
    alternatives = rate_alternatives(0.5, config.median_alarm_share)
    charts = [
        [hit if v > 0 else miss if v < 0 else 0.0 for v in votes]
        for hit, miss in (bernoulli_llr(0.5, p1) for p1 in alternatives)
    ]
    cusum, chart, h = cusum_bank(charts, h)
    cusum = _in_pairs(cusum, cycles)
    estimate = quantile(ratios, 0.5)
    assert estimate is not None  # paired is non-empty
    lower, upper = order_statistic_bounds(ratios, 0.5, config.confidence)
    state = sequential_state(
        cusum,
        h,
        n,
        config.min_samples,
        passed=upper is not None and upper <= config.max_ratio,
        warned=estimate > config.max_ratio,
    )
    above = sum(1 for r in ratios if r > config.max_ratio)
    concurrent = ""
    shared = [c for c in cycles if len(c) > 1]
    if shared:
        grouped = sum(len(c) for c in shared)
        concurrent = f"; {grouped} pairs ran in {len(shared)} concurrent groups, a vote each"
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic=f"{metric} median paired ratio speculative/baseline",
        n_baseline=n,
        n_speculative=n,
        estimate=estimate,
        lower=lower,
        upper=upper,
        threshold=config.max_ratio,
        detail=f"{metric} median ratio {estimate:.3f} [{_fmt(lower)}, {_fmt(upper)}] vs max "
        f"{config.max_ratio:g} ({above}/{n} pairs above it); sign {cusum_note(cusum, h)} "
        f"on {len(cycles)} votes ({sum(1 for v in votes if v > 0)} above{concurrent}) for "
        f"a share above {config.max_ratio:g} of 0.5 → {alternatives[chart]:g} "
        f"(chart {chart + 1} of {len(alternatives)})",
        detector=reading(cusum, h),
    )


def _regression(
    config: LatencyGateConfig,
    window: Window,
    now: datetime,
    metric: LatencyMetric,
    paired: list[tuple[float, float]],
    groups: list[int],
    h: float,
    budget_30d: float,
) -> GateDecision | str:
    """Has the arm slowed down against itself? The first `regression_pin_pairs` pairs of
    the evidence (the window since the last transition, oldest first) pin the arm's
    healthy typical log ratio m̂ and its robust scale; the pairs after them feed a bank of
    Gaussian CUSUMs from m0 = m̂ + a pin margin (the pin's own error, as drift's pins:
    gates.pairs.drift.pin_margin) to m0 + log(1 + `max_regression`) and to 4× that shift,
    values clipped three scales below m0 and one above the alternative; a burst cycle's
    concurrent pairs feed the charts one value, their median (they may share a stall).
    PASS when the later pairs' median log ratio less m̂ has an upper bound (both medians'
    standard errors) within log(1 + `max_regression`).
    Replayable from the window alone: no stored state. A string (why it is not judged
    yet) while the pin is not complete."""
    name = f"{NAME}.{metric}.regression"
    pin = config.regression_pin_pairs
    logs = [math.log(s / b) for b, s in paired]
    if len(logs) < pin + GROSS_MIN_VALUES:
        return f"{metric} regression: pinning the arm's own ratio ({len(logs)} of {pin} pairs)"
    reference, later = logs[:pin], logs[pin:]
    # The charts' values: one per concurrent group (a group straddling the pin is split).
    # Their scale is the pairs' own, never smaller than that of a group's median: the
    # charts stay conservative.
    cycles = _cycles(groups[pin:])
    typical = [statistics.median(later[i] for i in cycle) for cycle in cycles]
    centre = quantile(reference, 0.5)
    assert centre is not None
    chi = math.sqrt((pin - 1) / float(chi2.ppf(1.0 - CALIBRATION_CONFIDENCE, pin - 1)))
    raw = _robust_scale(reference)
    sigma = raw * chi
    se = _MEDIAN_SE * sigma / math.sqrt(pin)
    shift = math.log(1.0 + config.max_regression)
    horizon = arl0_horizon(h, budget_30d)
    alpha = pin_alpha(budget_30d, 1) / 2.0  # each of the bank's two charts spends half
    charts, starts = [], []
    for size in (shift, 4.0 * shift):
        # Each chart starts its own pin margin above the pin (a gross chart tolerates a
        # larger pin error than the fine one before its run length suffers).
        scale = max(sigma, size / GROSS_SEPARATION)
        margin = float(pin_margin(se, chi, size, h + math.log(2.0), horizon, alpha))
        m0 = centre + margin
        starts.append(margin)
        # A chart's scale is at least its shift / GROSS_SEPARATION and values are clipped
        # one scale past its alternative, so one pair earns at most 7.5 nats: a stall on
        # the speculative arm, or two in a row, cannot decide alone (a steady arm has a
        # small scale, and the Gaussian model knows nothing of stalls).
        clipped = [min(max(x, m0 - 3.0 * scale), m0 + size + scale) for x in typical]
        charts.append(gaussian_llr(clipped, m0, m0 + size, scale))
    cusum, chart, h = cusum_bank(charts, h)
    cusum = _in_pairs(cusum, cycles)
    middle = quantile(later, 0.5)
    assert middle is not None
    rise = middle - centre
    later_se = _MEDIAN_SE * max(_robust_scale(later), _MIN_LOG_SCALE) / math.sqrt(len(later))
    z = float(norm.ppf(config.confidence))
    upper = rise + z * math.sqrt(later_se**2 + se**2)
    state = sequential_state(
        cusum,
        h,
        len(later),
        config.min_samples,
        passed=upper <= shift,
        warned=rise > shift,
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic=f"{metric} typical paired ratio against the arm's own pinned ratio",
        n_baseline=len(later),
        n_speculative=len(later),
        estimate=math.exp(rise),
        lower=None,
        upper=math.exp(upper),
        threshold=1.0 + config.max_regression,
        detail=f"{metric} regression: typical ratio {math.exp(middle):.3f} vs its pinned "
        f"{math.exp(centre):.3f} (first {pin} pairs), ×{math.exp(rise):.3f} "
        f"(upper {math.exp(upper):.3f}) vs max ×{1.0 + config.max_regression:g}; "
        f"{cusum_note(cusum, h)} from ×{math.exp(starts[chart]):.3f} (pin margin) to "
        f"×{math.exp(starts[chart] + (shift, 4.0 * shift)[chart]):.3f} of the pin "
        f"(chart {chart + 1} of 2), log-ratio scale {sigma:.3f}",
        detector=reading(cusum, h),
    )


def arl0_horizon(h: float, budget_30d: float) -> float:
    """Pairs per 30 days at the design rate: a detector's ARL0 (e^h) × its budget share."""
    return math.exp(h) * budget_30d


# The standard error of a sample median, in sds of a normal core: sqrt(π / 2).
_MEDIAN_SE = math.sqrt(math.pi / 2.0)


def _robust_scale(values: list[float]) -> float:
    """1.4826 × the median absolute deviation (the sd of a normal core, blind to stalls),
    floored so that identical timings cannot make every difference infinitely significant."""
    middle = quantile(values, 0.5)
    assert middle is not None
    mad = quantile([abs(v - middle) for v in values], 0.5)
    return max(1.4826 * (mad or 0.0), _MIN_LOG_SCALE)


def _ratio(
    config: LatencyGateConfig,
    window: Window,
    now: datetime,
    metric: LatencyMetric,
    q: float,
    paired: list[tuple[float, float]],
    groups: list[int],
    h: float,
) -> GateDecision:
    name = f"{NAME}.{metric}.{_pct(q)}"
    n = len(paired)
    cusum, level = _tail_discordance(paired, groups, config.max_ratio, q, config.alarm_factor, h)
    note = f"; {cusum_note(cusum, h)} on pairs where one side exceeds {level:.4g}s" if cusum else ""
    if n < max(config.min_samples, 2):
        state = _state(cusum, h, n, config.min_samples, passed=False, warned=False)
        return decision(
            name,
            config,
            window,
            now,
            state=state,
            statistic=f"{metric} {_pct(q)} ratio speculative/baseline",
            n_baseline=n,
            n_speculative=n,
            threshold=config.max_ratio,
            detail=f"{metric} {_pct(q)}: {n} pairs, fewer than min_samples "
            f"{config.min_samples} for a bound{note}",
            detector=reading(cusum, h) if cusum else None,
        )
    estimate, lower, upper = paired_bootstrap_quantile_ratio(
        [b for b, _ in paired],
        [s for _, s in paired],
        q,
        confidence=config.confidence,
        resamples=config.bootstrap_resamples,
        seed=config.bootstrap_seed,
    )
    state = _state(
        cusum,
        h,
        n,
        config.min_samples,
        passed=upper <= config.max_ratio,
        warned=estimate > config.max_ratio,
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic=f"{metric} {_pct(q)} ratio speculative/baseline",
        n_baseline=n,
        n_speculative=n,
        estimate=estimate,
        lower=lower,
        upper=upper,
        threshold=config.max_ratio,
        detail=f"{metric} {_pct(q)} ratio {estimate:.3f} "
        f"[{lower:.3f}, {upper:.3f}] vs max {config.max_ratio:g} (paired bootstrap){note}",
        detector=reading(cusum, h) if cusum else None,
    )


def _slo(
    config: LatencyGateConfig,
    window: Window,
    now: datetime,
    metric: LatencyMetric,
    q: float,
    max_seconds: float,
    values: list[float],
    h: float,
) -> GateDecision:
    name = f"{NAME}.{metric}.{_pct(q)}.slo"
    n = len(values)
    cusum = _exceedance(values, max_seconds, q, config.alarm_factor, h)
    note = f"; {cusum_note(cusum, h)}" if cusum else ""
    lower, upper = order_statistic_bounds(values, q, config.confidence)
    estimate = quantile(values, q)
    assert estimate is not None  # values is non-empty
    state = _state(
        cusum,
        h,
        n,
        config.min_samples,
        passed=upper is not None and upper <= max_seconds,
        warned=estimate > max_seconds,
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic=f"speculative {metric} {_pct(q)} seconds",
        n_speculative=n,
        estimate=estimate,
        lower=lower,
        upper=upper,
        threshold=max_seconds,
        detail=f"speculative {metric} {_pct(q)} {estimate:.4g}s "
        f"[{_fmt(lower)}, {_fmt(upper)}] vs SLO {max_seconds:g}s (order statistics){note}",
        detector=reading(cusum, h) if cusum else None,
    )


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"
