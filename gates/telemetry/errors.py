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
**Shared outages.** A baseline interval whose error count a calm baseline (failing at
the window's rate without the outages, read again once they are found) reaches with
probability at most `outage_alpha`, and `outage_margin_intervals` on each side, are left
out of the baseline's rate. A speculative interval overlapping one of them is not read
as is (the outage fails its requests too) but neither is it left out: as the pair error
gate keeps the speculative failures the baseline does not share, the CUSUM judges its
failures beyond the outage's own rate there. That rate r is read from the baseline's
outage interval (its Clopper–Pearson upper bound at the calibration level, less the
baseline's calm rate: 1 − (1 − upper) ÷ (1 − calm)); the interval's n requests and k
errors count as n·(1 − r) requests, k − n·r of them failed (at least 0): an arm failing
as the baseline does adds nothing, one failing 80 % of its requests where the baseline
fails 20 % adds evidence as a calm interval would. PASS reads calm intervals only. A
speculative interval no baseline interval overlaps (a failed baseline scrape) is left
out: without the baseline there is no excess to judge.
**4xx answers.** Both arms get the same traffic, so a share of requests answered 4xx
that exceeds the baseline's is the speculative arm's (a rejected request shape, a
shorter context, shed load). Where both arms' sources count 4xx (`client_errors`: a
gateway's status codes), the same check runs on them as a second component,
`telemetry.errors.4xx` beside `telemetry.errors.5xx`, with the same tolerance and each
with half the gate's share of the false-alarm budget (`arl0` × 2 apiece); 4xx the
baseline answers as often are shared and count for nothing. Without 4xx counts on both
arms the gate is the one check on errors, named `telemetry.errors`.
**Evidence expires.** When either arm has had no interval, or no request, for longer
than the gate's silence bound (`gates.telemetry.silence`), the gate is NODATA and says
which arm and since when, whatever the window held before.
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
from gates.telemetry.silence import silence
from gates.window import Window, combined, decision

NAME = "telemetry.errors"
_RATE_FLOOR = 1e-4  # a baseline that never fails still gets a positive in-control rate
_STATISTIC = "excess error rate per request, speculative − baseline"
_CLIENT_STATISTIC = "excess 4xx rate per request, speculative − baseline"
_CALM_PASSES = 3  # times the calm rate is read again without the intervals flagged


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
    `min_samples` requests per arm, or when an arm's evidence stopped (`silence`). With
    4xx counted on both arms, the checks on 5xx and on 4xx combined (the worst decides).
    `since` (the start of the current evidence) drops intervals that started before it."""
    base = select_intervals(baseline, config, now, since)
    spec = select_intervals(speculative, config, now, since)
    stopped = silence({"baseline": base, "speculative": spec}, now, config)
    if stopped is not None:
        window = Window(
            (),
            min((i.start for i in [*base, *spec]), default=None),
            max((i.end for i in [*base, *spec]), default=None),
        )
        return decision(
            NAME,
            config,
            window,
            now,
            state=GateState.NODATA,
            statistic=_STATISTIC,
            n_baseline=sum(i.requests for i in base),
            n_speculative=sum(i.requests for i in spec),
            threshold=float(config.min_samples),
            detail=stopped,
        )
    client_base = client_intervals(base)
    client_spec = client_intervals(spec)
    if not client_base or not client_spec:
        return rate_check(NAME, base, spec, config, now, arl0)
    components = [
        rate_check(f"{NAME}.5xx", base, spec, config, now, 2.0 * arl0),
        rate_check(
            f"{NAME}.4xx",
            client_base,
            client_spec,
            config,
            now,
            2.0 * arl0,
            what="4xx answers",
            statistic=_CLIENT_STATISTIC,
        ),
    ]
    every = [*base, *spec]
    window = Window(
        (), min((i.start for i in every), default=None), max((i.end for i in every), default=None)
    )
    return combined(NAME, config, window, now, components)


def client_intervals(intervals: Sequence[CountInterval]) -> list[CountInterval]:
    """The intervals that count 4xx answers, read as errors (the 4xx check's input)."""
    return [
        CountInterval(i.start, i.end, i.requests, i.client_errors)
        for i in intervals
        if i.client_errors is not None
    ]


def rate_check(
    name: str,
    base: Sequence[CountInterval],
    spec: Sequence[CountInterval],
    config: TelemetryErrorGateConfig,
    now: datetime,
    arl0: float,
    *,
    what: str = "errors",
    statistic: str = _STATISTIC,
) -> GateDecision:
    """One check of the speculative arm's rate of `what` (the intervals' `errors`)
    against the baseline's (module docstring), named `name`."""
    outage = shared_outages(base, alpha=config.outage_alpha, margin=config.outage_margin_intervals)
    calm_base = [i for i, out in zip(base, outage, strict=True) if not out]
    n_base = sum(i.requests for i in calm_base)
    errors_base = sum(i.errors for i in calm_base)
    shares = outage_shares(
        base,
        outage,
        margin=config.outage_margin_intervals,
        calm_rate=errors_base / n_base if n_base else 0.0,
    )
    judged, in_outage, uncovered = screen(spec, base, shares)
    calm_spec = [i for i, share in judged if share is None]
    n_spec = sum(i.requests for i in calm_spec)
    window = Window(
        (),
        min((i.start for i in [*calm_base, *calm_spec]), default=None),
        max((i.end for i in [*calm_base, *calm_spec]), default=None),
    )
    beyond = [beyond_outage(i, share) for i, share in judged if share is not None]
    left_out = (
        f"left out: {len(base) - len(calm_base)} baseline intervals in shared outages, "
        f"{uncovered} speculative intervals with no baseline interval beside them; "
        f"{in_outage} speculative intervals overlapping an outage judged on their {what} "
        f"beyond its rate ({sum(k for k, _ in beyond):.0f} of "
        f"{sum(n for _, n in beyond):.0f} requests)"
    )
    if n_base == 0 or n_spec == 0:
        return decision(
            name,
            config,
            window,
            now,
            state=GateState.NODATA,
            statistic=statistic,
            n_baseline=n_base,
            n_speculative=n_spec,
            threshold=float(config.min_samples),
            detail=f"{n_base} baseline and {n_spec} speculative requests in the window, "
            f"fewer than min_samples={config.min_samples}; {left_out}",
        )
    errors_spec = sum(i.errors for i in calm_spec)
    _, base_upper = clopper_pearson(errors_base, n_base, CALIBRATION_CONFIDENCE)
    # The edge of acceptable: the baseline's own rate (its upper bound) plus the excess
    # tolerated; the alarm is for `alarm_factor` times that and beyond.
    p0 = min(max(base_upper, _RATE_FLOOR) + config.max_excess_rate, 0.5)
    alternatives = rate_alternatives(p0, min(config.alarm_factor * p0, 0.99))
    h = lorden_threshold(arl0)
    counted = [
        (float(i.errors), float(i.requests)) if share is None else beyond_outage(i, share)
        for i, share in judged
    ]
    cusum, chart, h = cusum_bank([interval_increments(counted, p0, p1) for p1 in alternatives], h)
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
        name,
        config,
        window,
        now,
        state=state,
        statistic=statistic,
        n_baseline=n_base,
        n_speculative=n_spec,
        estimate=excess,
        lower=lower,
        upper=upper,
        threshold=config.max_excess_rate,
        detail=f"{statistic} {excess:.4f} (upper bound {upper:.4f}) vs max "
        f"{config.max_excess_rate:g}; speculative {errors_spec}/{n_spec} {what} in "
        f"{len(calm_spec)} calm intervals, baseline {errors_base}/{n_base}; "
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
    out = [False] * len(baseline)
    for index in outage_cores(baseline, alpha):
        for near in range(max(index - margin, 0), min(index + margin + 1, len(baseline))):
            out[near] = True
    return out


def outage_cores(baseline: Sequence[CountInterval], alpha: float) -> list[int]:
    """The baseline intervals whose own error counts make them outages (`shared_outages`
    without the margins). The calm rate they are judged against is read from the
    intervals not (yet) flagged, again until the flags settle (at most `_CALM_PASSES`
    times): outages that crowd a short window would otherwise raise the rate they are
    measured against and hide each other."""
    flagged: list[int] = []
    for _ in range(_CALM_PASSES):
        kept = set(range(len(baseline))) - set(flagged)
        requests = sum(baseline[i].requests for i in kept)
        if requests == 0:
            break
        errors = sum(baseline[i].errors for i in kept)
        _, calm = clopper_pearson(errors, requests, CALIBRATION_CONFIDENCE)
        rate = min(max(calm, _RATE_FLOOR), 0.5)
        found = [
            index
            for index, interval in enumerate(baseline)
            if interval.errors >= 2
            and float(binom.sf(interval.errors - 1, interval.requests, rate)) <= alpha
        ]
        if found == flagged:
            break
        flagged = found
    return flagged


def outage_shares(
    baseline: Sequence[CountInterval], outage: Sequence[bool], *, margin: int, calm_rate: float
) -> list[float | None]:
    """Per baseline interval, the share of requests the shared outage itself failed there
    (None outside outages): the highest Clopper–Pearson upper bound, at the calibration
    level, of the baseline's error rate in the outage intervals within `margin` of it,
    less the baseline's `calm_rate` (1 − (1 − upper) ÷ (1 − calm_rate))."""
    upper = [
        clopper_pearson(i.errors, i.requests, CALIBRATION_CONFIDENCE)[1] if i.requests else 0.0
        for i in baseline
    ]
    shares: list[float | None] = []
    for index, out in enumerate(outage):
        if not out:
            shares.append(None)
            continue
        near = range(max(index - margin, 0), min(index + margin + 1, len(baseline)))
        worst = max(upper[j] for j in near if outage[j])
        shares.append(max(0.0, 1.0 - (1.0 - worst) / (1.0 - calm_rate)) if calm_rate < 1 else 1.0)
    return shares


def screen(
    speculative: Sequence[CountInterval],
    baseline: Sequence[CountInterval],
    shares: Sequence[float | None],
) -> tuple[list[tuple[CountInterval, float | None]], int, int]:
    """The speculative intervals judged, oldest first, each with the outage's share of
    failures where it overlaps a baseline outage (the largest of those it overlaps; None
    where it overlaps none), how many overlap an outage, and how many no baseline
    interval at all (left out)."""
    ends = [i.end for i in baseline]
    judged: list[tuple[CountInterval, float | None]] = []
    in_outage = uncovered = 0
    for interval in speculative:
        index = bisect.bisect_right(ends, interval.start)
        covered = False
        share: float | None = None
        while index < len(baseline) and baseline[index].start < interval.end:
            covered = True
            if (found := shares[index]) is not None:
                share = found if share is None else max(share, found)
            index += 1
        if not covered:
            uncovered += 1
            continue
        in_outage += share is not None
        judged.append((interval, share))
    return judged, in_outage, uncovered


def beyond_outage(interval: CountInterval, share: float) -> tuple[float, float]:
    """(failures, requests) of a speculative interval beyond a shared outage that fails
    `share` of requests: its requests less the outage's share of them, its failures less
    the same number (at least 0). An arm that fails as the outage does counts as calm."""
    shared = interval.requests * share
    return max(interval.errors - shared, 0.0), interval.requests - shared


def interval_increments(
    counted: Sequence[tuple[float, float]], p0: float, p1: float
) -> list[float]:
    """Each interval's log-likelihood ratio of Bernoulli(p1) against Bernoulli(p0) over
    its requests, from its (failures, requests): failures × log-LR of a failure +
    successes × log-LR of a success."""
    failure, success = bernoulli_llr(p0, p1)
    return [errors * failure + (requests - errors) * success for errors, requests in counted]


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
