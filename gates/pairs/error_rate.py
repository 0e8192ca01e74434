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
  pairs look like a speculative fault. But an outage strikes both arms alike, so
  clusters are left out only when their failures split as an outage's do (see
  `shared_outages`): when the window's clusters, pooled, show the speculative arm
  failing alone improbably often, or its failures improbably often coming first (the
  baseline's following within `lead_pairs`), they are evidence and judged — a dead arm
  beside a failing baseline, or an arm that takes a shared node down and the baseline's
  next requests with it; and a cluster in which the speculative arm did not fail
  improbably often too is the baseline's own, and judged;
- the newest `settle_pairs` pairs: a pair is judged once the pairs after it show
  whether an outage was starting (a dead speculative arm is also the liveness gate's,
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
- ceiling: a Bernoulli CUSUM on the speculative arm's **own** failures — those on pairs
  where the baseline succeeded, as it did on the `lead_pairs` pairs before (a failure
  right after the other arm's may be its collateral) — against the larger of
  `max_error_rate` and the baseline's own failure rate: the rate at which the baseline
  fails where the speculative arm succeeded on that pair and the `lead_pairs` before, or
  its plain failure rate if lower (each a 95 % upper bound). Equal arms on flaky
  infrastructure fail at the same rate and never FAIL it; an arm whose failures make the
  baseline fail next (a shared node or GPU) is judged against the baseline's rate
  without that collateral. Alternatives `alarm_factor` × the edge, and 4× and 16× that
  (a bank); PASS when the Clopper–Pearson upper bound is under the edge.
The gate never PASSes blind: while more than `max_outage_share` of the newest
`min_samples` settled pairs lie in shared outages, or when its newest judged pair has
more than `stale_pairs` settled pairs after it, a PASS is INCONCLUSIVE.
A timeout, an HTTP error, an OOM or an invalid response all count as errors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from itertools import accumulate

from scipy.stats import binom, norm

from gates.config import ErrorGateConfig
from gates.core import GateDecision, GateState
from gates.records import PairRecord
from gates.stats.descriptive import clopper_pearson
from gates.stats.detectors import CALIBRATION_CONFIDENCE, rate_alternatives, rate_check
from gates.stats.sequential import lorden_threshold
from gates.window import Window, combined, nodata, select

NAME = "error"
_RATE_FLOOR = 1e-4  # a baseline that never fails still gets a positive in-control rate


def error_gate(
    records: Sequence[PairRecord],
    config: ErrorGateConfig,
    *,
    now: datetime,
    arl0: float,
    since: datetime | None = None,
) -> GateDecision:
    """FAIL when either detector alarms; PASS when both bounds hold on recent pairs."""
    window = select(records, config, now, since)
    pairs = window.records
    if not pairs:
        return nodata(NAME, config, window, now, 0)
    baseline_failed = [not r.baseline.ok for r in pairs]
    speculative_failed = [not r.speculative.ok for r in pairs]
    _, calm_rate = clopper_pearson(sum(baseline_failed), len(pairs), CALIBRATION_CONFIDENCE)
    _, speculative_rate = clopper_pearson(
        sum(speculative_failed), len(pairs), CALIBRATION_CONFIDENCE
    )
    outage = shared_outages(
        baseline_failed,
        calm_rate,
        spans=config.outage_spans,
        alpha=config.outage_alpha,
        margin=config.outage_margin_pairs,
        speculative_failed=speculative_failed,
        speculative_rate=speculative_rate,
        lead=config.lead_pairs,
        evidence_alpha=config.outage_evidence_alpha,
    )
    settled = max(len(pairs) - config.settle_pairs, 0)
    calm = [i for i in range(settled) if not outage[i]]
    judged = [i for i in calm if not (baseline_failed[i] and speculative_failed[i])]
    in_outage, both_failed = settled - len(calm), len(calm) - len(judged)
    if not judged:
        return nodata(NAME, config, window, now, 0)
    h = lorden_threshold(arl0)
    n = len(judged)
    baseline_only = sum(1 for i in judged if baseline_failed[i])
    _, baseline_upper = clopper_pearson(baseline_only, n, CALIBRATION_CONFIDENCE)
    speculative_only = sum(1 for i in judged if speculative_failed[i])
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
        hits=[speculative_failed[i] for i in judged],
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
    ceiling = _ceiling(config, window, now, h, judged, calm, baseline_failed, speculative_failed)
    decision = combined(NAME, config, window, now, [paired, ceiling])
    blind = blindness(config, outage, settled, judged[-1])
    if decision.state is GateState.PASS and blind:
        return replace(
            decision,
            state=GateState.INCONCLUSIVE,
            detail=f"INCONCLUSIVE: {blind}; " + decision.detail.removeprefix("PASS "),
        )
    return decision


def _ceiling(
    config: ErrorGateConfig,
    window: Window,
    now: datetime,
    h: float,
    judged: Sequence[int],
    calm: Sequence[int],
    baseline_failed: Sequence[bool],
    speculative_failed: Sequence[bool],
) -> GateDecision:
    """The ceiling check: the speculative arm's own failures against the larger of
    `max_error_rate` and the baseline's own rate (see the module's docstring)."""
    lead = config.lead_pairs
    baseline_clean = clean(baseline_failed, lead)
    speculative_clean = clean(speculative_failed, lead)
    hits = [speculative_failed[i] for i in judged if baseline_clean[i]]
    own = [baseline_failed[i] for i in judged if speculative_clean[i]]
    own_upper = clopper_pearson(sum(own), len(own), CALIBRATION_CONFIDENCE)[1] if own else 1.0
    plain_failures = sum(1 for i in calm if baseline_failed[i])
    _, plain_upper = clopper_pearson(plain_failures, len(calm), CALIBRATION_CONFIDENCE)
    edge = min(max(config.max_error_rate, min(own_upper, plain_upper)), 0.5)
    return rate_check(
        f"{NAME}.ceiling",
        config,
        window,
        now,
        hits=hits,
        tolerance=edge,
        p0=edge,
        p1=rate_alternatives(edge, min(config.alarm_factor * edge, 0.99)),
        h=h,
        statistic="speculative error rate where the baseline succeeded",
        note=f"; the edge: max_error_rate {config.max_error_rate:g} or the baseline's own "
        f"rate, {sum(own)}/{len(own)} where the speculative arm succeeded on the pair and "
        f"the {lead} before (95 % bound {own_upper:.4f}; plain {plain_failures}/"
        f"{len(calm)}, bound {plain_upper:.4f}); only pairs whose baseline succeeded on "
        f"the {lead} before count",
    )


def blindness(
    config: ErrorGateConfig, outage: Sequence[bool], settled: int, newest_judged: int
) -> str:
    """Why a PASS would rest on old evidence, or "" if it would not: too many of the
    newest settled pairs in shared outages, or the newest judged pair too old."""
    reasons = []
    recent = range(max(settled - config.min_samples, 0), settled)
    if recent:
        share = sum(1 for i in recent if outage[i]) / len(recent)
        if share > config.max_outage_share:
            reasons.append(
                f"{share:.0%} of the newest {len(recent)} settled pairs lie in shared "
                f"outages (max {config.max_outage_share:.0%})"
            )
    behind = settled - 1 - newest_judged
    if behind > config.stale_pairs:
        reasons.append(
            f"the newest judged pair has {behind} settled pairs after it, none judged "
            f"(max {config.stale_pairs})"
        )
    return "; ".join(reasons)


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


# --- the shared-outage screen -----------------------------------------------------------


def clean(failed: Sequence[bool], lead: int) -> list[bool]:
    """Per pair: the arm succeeded on it and on the `lead` pairs before (pairs before the
    window's first count as successes)."""
    counts = [0, *accumulate(int(x) for x in failed)]
    return [counts[i + 1] - counts[max(i - lead, 0)] == 0 for i in range(len(failed))]


def speculative_led(
    pairs: Iterable[int],
    baseline_failed: Sequence[bool],
    speculative_failed: Sequence[bool],
    lead: int,
    alpha: float,
) -> bool:
    """Whether the failures in `pairs` are evidence against the speculative arm rather
    than a shared outage's: an outage that strikes both arms alike makes each discordant
    pair a fair coin between them, and so each failure that the other arm neither shared
    nor preceded within `lead` pairs. True when either count leans to the speculative arm
    with a one-sided binomial p-value at most `alpha` / 2."""
    speculative_only = baseline_only = speculative_first = baseline_first = 0
    for i in pairs:
        before = slice(max(i - lead, 0), i)
        if speculative_failed[i] and not baseline_failed[i]:
            speculative_only += 1
            speculative_first += not any(baseline_failed[before])
        elif baseline_failed[i] and not speculative_failed[i]:
            baseline_only += 1
            baseline_first += not any(speculative_failed[before])
    return any(
        ahead > 0 and float(binom.sf(ahead - 1, ahead + behind, 0.5)) <= alpha / 2.0
        for ahead, behind in (
            (speculative_only, baseline_only),
            (speculative_first, baseline_first),
        )
    )


def improbable_count(n: int, rate: float, alpha: float) -> int | None:
    """The smallest count k ≥ 2 of failures in n pairs that an arm failing at `rate`
    reaches with probability at most `alpha`; None when even n is not that improbable."""
    k = max(int(binom.isf(alpha, n, min(max(rate, _RATE_FLOOR), 0.5))) + 1, 2)
    return k if k <= n else None


def shared_outages(
    baseline_failed: Sequence[bool],
    calm_rate: float,
    *,
    spans: Sequence[int],
    alpha: float,
    margin: int,
    speculative_failed: Sequence[bool] | None = None,
    speculative_rate: float = 0.0,
    lead: int = 0,
    evidence_alpha: float = 0.0,
) -> list[bool]:
    """Which pairs lie in a shared outage: from the first to the last baseline failure of
    a cluster, and `margin` pairs on each side. A cluster is a span of n (each of
    `spans`) consecutive pairs in which the baseline failed at least k_n times, k_n the
    smallest count (at least 2) that a baseline failing at `calm_rate` reaches in n pairs
    with probability at most `alpha` (`improbable_count`).

    Given `speculative_failed`, clusters are screened before they are left out. The
    window's clusters whose failures, pooled, lean to the speculative arm
    (`speculative_led` at `evidence_alpha`) are evidence, not outages: none is left out
    (one cluster's counts are too few to tell an arm that takes a shared node down from
    an outage; the window's are not). And an outage strikes both arms: a cluster
    (overlapping ones merged, margins included) is left out only where the speculative
    arm failed improbably often too for its own `speculative_rate`. A baseline that fails
    often clusters its own failures by chance, and leaving those out alone would make the
    speculative arm look worse than it is; a cluster where the speculative arm failed as
    usual says nothing against it either way, and is judged."""
    size = len(baseline_failed)
    failures = [i for i, failed in enumerate(baseline_failed) if failed]
    marks = [0] * (size + 1)  # +1 where a left-out run starts, −1 where it ends
    cores = [0] * (size + 1)  # the same without the margins
    for n in spans:
        k = improbable_count(n, calm_rate, alpha)
        if k is None:
            continue
        # k failures within n pairs: failures[j] .. failures[j + k − 1] span at most n
        for j in range(len(failures) - k + 1):
            first, last = failures[j], failures[j + k - 1]
            if last - first < n:
                marks[max(first - margin, 0)] += 1
                marks[min(last + 1 + margin, size)] -= 1
                cores[first] += 1
                cores[last + 1] -= 1
    out, core = _marked(marks, size), _marked(cores, size)
    if speculative_failed is None:
        return out
    # The split is read from the clusters' cores, first to last baseline failure: the
    # margins hold no baseline failure by construction, so there every failure would
    # count for the speculative arm whatever the arms did.
    clustered = [i for i, x in enumerate(core) if x]
    if clustered and speculative_led(
        clustered, baseline_failed, speculative_failed, lead, evidence_alpha
    ):
        return [False] * size
    for cluster in _runs(out):
        k = improbable_count(len(cluster), speculative_rate, alpha)
        if k is None or sum(1 for i in cluster if speculative_failed[i]) < k:
            for i in cluster:
                out[i] = False
    return out


def _marked(marks: Sequence[int], size: int) -> list[bool]:
    """Per pair: inside at least one run, from +1 / −1 marks at runs' starts and ends."""
    out, depth = [], 0
    for i in range(size):
        depth += marks[i]
        out.append(depth > 0)
    return out


def _runs(marked: Sequence[bool]) -> list[range]:
    """The maximal runs of marked pairs."""
    runs, start = [], None
    for i, value in enumerate([*marked, False]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            runs.append(range(start, i))
            start = None
    return runs
