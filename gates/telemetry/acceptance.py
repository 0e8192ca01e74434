"""The `telemetry.acceptance` gate: has the speculative arm's acceptance length on all
production traffic fallen below its reference?

It reads the speculative arm's own speculative-decoding counters (drafts, i.e. verify
steps; draft tokens; accepted tokens), interval by interval. The acceptance length is
1 + accepted ÷ drafts (the bonus token counted, as vLLM does) and the acceptance rate
accepted ÷ draft tokens; the decision's `estimate` is the window's acceptance length.

**Reference.** The concurrent stable when the evidence holds one (`evidence.stable`: the
pods serving the previous revision beside the one judged, over the same scrapes), judged
interval by interval in `gates.telemetry.concurrent`: same traffic, same moment, so the
traffic mix cancels. Else a reference from the past: `reference_acceptance_length` when
configured (taken as exact), else an `AcceptanceReference` the caller pinned from the
arm's own healthy telemetry with `pin_acceptance_reference` (the first `pin_min_drafts`
drafts, over at least `pin_min_intervals` intervals, of the evidence) and passes back
in. Without one the gate is NODATA and says so, its estimate still the window's length.
A decision against the past holds only where the mix is shown comparable
(`gates.telemetry.mix`, applied by `gates.cycle.judge`).

**Noise.** Drafts of one request are alike (a code completion accepts more than a
poem), so accepted tokens per draft vary between intervals more than independent
drafts would. The gate models an interval's accepted-per-draft x_i as N(m, s² ÷ D_i)
for its D_i drafts, s² the per-draft dispersion that includes the between-request
spread: the largest of the reference's estimate (its weighted spread between
intervals, at its chi-square upper bound), the window's own (from successive
differences, median-based, so that a step change does not inflate it) and a binomial
floor. Evidence is thus counted in drafts, weighted by how much they really vary.

- FAIL: a Gaussian likelihood-ratio CUSUM over the window's intervals, oldest first:
  in control, the edge of the tolerance, a length of (1 − `max_relative_drop`) × the
  reference (its lower bound at the calibration level); alternatives, drops of
  `alarm_relative_drop`, halfway to no acceptance at all, and none at all (a bank).
  Each chart's per-interval scale is at least its shift ÷ 3 and values are clipped
  3 scales outside its means, so no single interval alarms however wild. The threshold
  is log(`arl0`), `arl0` counted in intervals.
- PASS: the lower bound of the window's length minus the edge, both uncertainties
  counted (Welch), at or above zero, with at least `min_samples` drafts over
  `min_intervals` intervals.
When the speculative arm has had no interval, or served nothing, for longer than the
gate's silence bound (`gates.telemetry.silence`), the gate is NODATA and says since when.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from scipy.stats import chi2, norm
from scipy.stats import t as t_dist

from gates.config import TelemetryAcceptanceGateConfig
from gates.core import GateDecision, GateState
from gates.stats.detectors import CALIBRATION_CONFIDENCE, reading, sequential_state
from gates.stats.sequential import GROSS_SEPARATION, cusum_bank, lorden_threshold
from gates.telemetry.concurrent import aligned, concurrent_acceptance
from gates.telemetry.errors import interval_note
from gates.telemetry.intervals import (
    ArmTelemetry,
    TelemetryEvidence,
    TelemetryInterval,
)
from gates.telemetry.silence import silence
from gates.window import Window, decision

NAME = "telemetry.acceptance"
STATISTIC = "acceptance length (1 + accepted ÷ drafts), speculative arm, production traffic"
_CLIP_SCALES = 3.0
_MEDIAN_CHI2_1 = 0.454936  # the median of χ² with one degree of freedom
_MIN_DIFFERENCES = 5  # successive differences before the window's own spread counts


@dataclass(frozen=True, slots=True)
class AcceptanceReference:
    """The speculative arm's healthy acceptance: its length (1 + accepted ÷ drafts) and
    rate, the per-draft dispersion s² of accepted tokens (spread between requests
    included; None when configured) and the drafts and intervals it was pinned from (0
    when configured: taken as exact)."""

    acceptance_length: float
    acceptance_rate: float | None = None
    dispersion: float | None = None
    drafts: int = 0
    intervals: int = 0
    pinned_at: datetime | None = None

    @property
    def accepted_per_draft(self) -> float:
        return self.acceptance_length - 1.0


@dataclass(frozen=True, slots=True)
class _Counts:
    """One interval's speculative counters, drafts > 0."""

    drafts: int
    accepted: int
    draft_tokens: int | None

    @property
    def per_draft(self) -> float:
        return self.accepted / self.drafts


def _counts(intervals: Sequence[TelemetryInterval]) -> list[_Counts]:
    return [
        _Counts(i.drafts, i.accepted_tokens, i.draft_tokens)
        for i in intervals
        if i.drafts and i.accepted_tokens is not None
    ]


def _pooled(counts: Sequence[_Counts]) -> tuple[float, float | None]:
    """(acceptance length, acceptance rate) over `counts`."""
    drafts = sum(c.drafts for c in counts)
    accepted = sum(c.accepted for c in counts)
    tokens = [c.draft_tokens for c in counts]
    rate = (
        accepted / sum(t for t in tokens if t is not None)
        if tokens and all(t for t in tokens)
        else None
    )
    return 1.0 + accepted / drafts, rate


def weighted_dispersion(counts: Sequence[_Counts]) -> float | None:
    """Σ D_i (x_i − x̄)² ÷ (n − 1): unbiased for s² when x_i ~ (m, s² ÷ D_i); None
    below two intervals."""
    if len(counts) < 2:
        return None
    drafts = sum(c.drafts for c in counts)
    mean = sum(c.accepted for c in counts) / drafts
    return sum(c.drafts * (c.per_draft - mean) ** 2 for c in counts) / (len(counts) - 1)


def successive_dispersion(counts: Sequence[_Counts]) -> float | None:
    """s² from successive differences, median-based: a step change (a fault that
    began within the window) is one large difference among many, not a wider spread."""
    if len(counts) <= _MIN_DIFFERENCES:
        return None
    scaled = [
        (b.per_draft - a.per_draft) ** 2 / (1.0 / a.drafts + 1.0 / b.drafts)
        for a, b in itertools.pairwise(counts)
    ]
    return statistics.median(scaled) / _MEDIAN_CHI2_1


def binomial_floor(counts: Sequence[_Counts], per_draft: float) -> float:
    """The per-draft variance of `per_draft` accepted tokens out of k independent
    draft tokens, k the window's draft tokens per draft (a run of accepted tokens
    varies more): the least s² can be."""
    tokens = [c.draft_tokens for c in counts if c.draft_tokens]
    drafts = sum(c.drafts for c in counts if c.draft_tokens)
    k = sum(tokens) / drafts if tokens and drafts else max(per_draft + 1.0, 1.0)
    share = min(max(per_draft / k, 0.0), 1.0) if k > 0 else 0.0
    return max(k * share * (1.0 - share), 1e-3)


def pin_acceptance_reference(
    speculative: ArmTelemetry,
    config: TelemetryAcceptanceGateConfig,
    *,
    now: datetime,
    since: datetime | None = None,
) -> AcceptanceReference | None:
    """The reference to pin from the arm's healthy telemetry: its earliest intervals in
    the window (from `since`) until `pin_min_drafts` drafts and `pin_min_intervals`
    intervals; None until there are that many. The caller decides when telemetry is
    healthy enough to pin from, and keeps the pin."""
    chosen = _counts(
        speculative.window(
            now,
            window_seconds=config.window_seconds,
            window_intervals=config.window_pairs,
            since=since,
        )
    )
    taken: list[_Counts] = []
    for counts in chosen:
        taken.append(counts)
        enough = sum(c.drafts for c in taken) >= config.pin_min_drafts
        if enough and len(taken) >= config.pin_min_intervals:
            length, rate = _pooled(taken)
            return AcceptanceReference(
                acceptance_length=length,
                acceptance_rate=rate,
                dispersion=weighted_dispersion(taken),
                drafts=sum(c.drafts for c in taken),
                intervals=len(taken),
                pinned_at=now,
            )
    return None


def telemetry_acceptance_gate(
    evidence: TelemetryEvidence,
    config: TelemetryAcceptanceGateConfig,
    *,
    now: datetime,
    arl0: float,
    since: datetime | None = None,
    reference: AcceptanceReference | None = None,
) -> GateDecision:
    """FAIL when the CUSUM alarms, PASS when the window's length credibly holds within
    `max_relative_drop` of the reference; NODATA without draft counters, without a
    reference (configured or pinned), below `min_samples` drafts, or when the arm's
    evidence stopped (`gates.telemetry.silence`). Reads the speculative arm and, where
    the evidence holds it, the concurrent stable (which then is the reference). `arl0`
    is the detector's in-control run length in intervals; `since` (the start of the
    current evidence) drops intervals that started before it. Without a concurrent
    stable, a configured `reference_acceptance_length` overrides `reference`."""
    intervals = evidence.speculative.window(
        now, window_seconds=config.window_seconds, window_intervals=config.window_pairs, since=since
    )
    counts = _counts(intervals)
    window = Window(
        (),
        min((i.start for i in intervals), default=None),
        max((i.end for i in intervals), default=None),
    )
    stopped = silence({"speculative": intervals}, now, config)
    if stopped is not None:
        if not counts:
            return _nodata(config, window, now, stopped)
        drafts = sum(c.drafts for c in counts)
        return _nodata(
            config, window, now, stopped, estimate=_pooled(counts)[0], n_speculative=drafts
        )
    blocks = aligned(
        intervals,
        evidence.stable.window(
            now,
            window_seconds=config.window_seconds,
            window_intervals=config.window_pairs,
            since=since,
        ),
    )
    if blocks:
        return concurrent_acceptance(blocks, config, window, now, lorden_threshold(arl0))
    if config.reference_acceptance_length is not None:
        reference = AcceptanceReference(config.reference_acceptance_length)
    drafts = sum(c.drafts for c in counts)
    if not counts:
        gauge = any(i.reported_acceptance_length is not None for i in intervals)
        reason = (
            "the speculative arm reports acceptance only as a gauge, which carries no "
            "count of drafts to weigh"
            if gauge
            else "no draft counters (drafts, accepted tokens) from the speculative arm"
        )
        return _nodata(config, window, now, f"{reason} in {len(intervals)} intervals")
    length, rate = _pooled(counts)
    if reference is None:
        return _nodata(
            config,
            window,
            now,
            f"acceptance length {length:.3f} over {drafts} drafts; no reference pinned yet "
            f"(pinned from the first {config.pin_min_drafts} drafts of healthy telemetry)",
            estimate=length,
            n_speculative=drafts,
        )
    return _judge(config, window, now, counts, length, rate, reference, lorden_threshold(arl0))


def _nodata(
    config: TelemetryAcceptanceGateConfig,
    window: Window,
    now: datetime,
    detail: str,
    **evidence: float | int,
) -> GateDecision:
    return decision(
        NAME,
        config,
        window,
        now,
        state=GateState.NODATA,
        statistic=STATISTIC,
        threshold=float(config.min_samples),
        detail=detail,
        **evidence,
    )


def _judge(
    config: TelemetryAcceptanceGateConfig,
    window: Window,
    now: datetime,
    counts: Sequence[_Counts],
    length: float,
    rate: float | None,
    reference: AcceptanceReference,
    h: float,
) -> GateDecision:
    drafts = sum(c.drafts for c in counts)
    per_draft = length - 1.0
    floor = binomial_floor(counts, reference.accepted_per_draft)
    pinned = reference.drafts > 0 and reference.dispersion is not None
    reference_spread = _reference_spread(reference)
    window_spread = successive_dispersion(counts)
    if pinned:
        dispersion = max(floor, reference_spread, window_spread or 0.0)
    else:
        # A configured reference says nothing of the spread: the window's own, once it
        # has enough intervals; until then no evidence.
        dispersion = max(floor, window_spread) if window_spread is not None else math.inf
    # The reference's own error: its mean at the calibration level's lower bound.
    reference_se = math.sqrt(reference_spread / reference.drafts) if pinned else 0.0
    z = float(norm.ppf(CALIBRATION_CONFIDENCE))
    keep = 1.0 - config.max_relative_drop
    m0 = keep * (reference.acceptance_length - z * reference_se) - 1.0
    full = 1.0 - 1.0 / reference.acceptance_length  # the drop to no acceptance at all
    drops = sorted({config.alarm_relative_drop, (config.alarm_relative_drop + full) / 2.0, full})
    alternatives = [m1 for d in drops if (m1 := (1.0 - d) * reference.acceptance_length - 1.0) < m0]
    if alternatives:
        charts = [_chart(counts, m0, m1, dispersion) for m1 in alternatives]
    else:  # the tolerance admits no acceptance at all: nothing to detect
        alternatives, charts = [m0], [[0.0] * len(counts)]
    cusum, chart, bank_h = cusum_bank(charts, h)
    lower, upper, margin_lower = _bounds(counts, reference, floor, config)
    state = sequential_state(
        cusum,
        bank_h,
        drafts if len(counts) >= config.min_intervals else 0,
        config.min_samples,
        passed=margin_lower >= 0.0,
        warned=length < keep * reference.acceptance_length,
    )
    drop = 1.0 - length / reference.acceptance_length
    source = (
        f"pinned from {reference.drafts} drafts over {reference.intervals} intervals"
        if pinned
        else "configured"
    )
    rate_note = f", rate {rate:.3f}" if rate is not None else ""
    reference_rate = (
        f", rate {reference.acceptance_rate:.3f}" if reference.acceptance_rate is not None else ""
    )
    return decision(
        NAME,
        config,
        window,
        now,
        state=state,
        statistic=STATISTIC,
        n_baseline=reference.drafts,
        n_speculative=drafts,
        estimate=length,
        lower=lower,
        upper=upper,
        threshold=keep * reference.acceptance_length,
        detail=f"acceptance length {length:.3f}{rate_note} over {drafts} drafts in "
        f"{len(counts)} intervals vs reference {reference.acceptance_length:.3f}"
        f"{reference_rate} ({source}): drop {drop:.1%}, tolerated "
        f"{config.max_relative_drop:.0%} (length ≥ {keep * reference.acceptance_length:.3f}); "
        f"{interval_note(cusum, bank_h)} for accepted per draft {m0:.3f} → "
        f"{alternatives[chart]:.3f} (per-draft sd {math.sqrt(dispersion):.3f}); "
        f"accepted per draft {per_draft:.3f}",
        detector=reading(cusum, bank_h),
    )


def _reference_spread(reference: AcceptanceReference) -> float:
    """The pinned dispersion at its chi-square upper bound (calibration level, one
    degree of freedom per interval past the first); 0 for a configured reference."""
    if reference.drafts <= 0 or reference.dispersion is None:
        return 0.0
    dof = max(reference.intervals - 1, 1)
    return reference.dispersion * dof / float(chi2.ppf(1.0 - CALIBRATION_CONFIDENCE, dof))


def _chart(counts: Sequence[_Counts], m0: float, m1: float, dispersion: float) -> list[float]:
    """Per interval, the log-likelihood ratio of N(m1, σ_i²) against N(m0, σ_i²) for its
    accepted tokens per draft, σ_i = max(s ÷ √D_i, |m1 − m0| ÷ 3), clipped 3 σ_i outside
    the two means. Zero evidence at an infinite dispersion."""
    if math.isinf(dispersion):
        return [0.0] * len(counts)
    shift = m1 - m0
    increments = []
    for c in counts:
        scale = max(math.sqrt(dispersion / c.drafts), abs(shift) / GROSS_SEPARATION)
        low = min(m0, m1) - _CLIP_SCALES * scale
        high = max(m0, m1) + _CLIP_SCALES * scale
        value = min(max(c.per_draft, low), high)
        increments.append(shift / (scale * scale) * (value - (m0 + m1) / 2.0))
    return increments


def _bounds(
    counts: Sequence[_Counts],
    reference: AcceptanceReference,
    floor: float,
    config: TelemetryAcceptanceGateConfig,
) -> tuple[float | None, float | None, float]:
    """One-sided bounds at `confidence` on the window's acceptance length (None below
    two intervals), and the lower bound of length − (1 − `max_relative_drop`) ×
    reference, the reference's error counted (Welch, the window's intervals' degrees of
    freedom)."""
    drafts = sum(c.drafts for c in counts)
    length = 1.0 + sum(c.accepted for c in counts) / drafts
    spread = weighted_dispersion(counts)
    if spread is None:
        return None, None, -math.inf
    spread = max(spread, floor)
    quantile = float(t_dist.ppf(config.confidence, len(counts) - 1))
    se = math.sqrt(spread / drafts)
    keep = 1.0 - config.max_relative_drop
    reference_var = 0.0
    if reference.drafts > 0 and reference.dispersion is not None:
        reference_var = keep**2 * max(reference.dispersion, floor) / reference.drafts
    margin = length - keep * reference.acceptance_length
    margin_lower = margin - quantile * math.sqrt(se * se + reference_var)
    return length - quantile * se, length + quantile * se, margin_lower
