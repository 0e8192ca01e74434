"""The quality gate: does the speculative arm answer as well as the baseline?

Four detectors on the scored pairs of the window (pairs where both arms succeeded),
oldest first:
- mismatch (greedy pairs only, temperature 0): a lossless speculative decoder reproduces
  greedy output exactly up to hardware numerics, so a divergence is a bug unless every
  divergent token the baseline model judged lies within `tie_margin_nats` of its own
  choice, either way (a numeric tie, counted apart; canaryd.scoring.margins: every token
  teacher-forced where the baseline can score an output, the first divergent token from
  its own top log-probs elsewhere); a divergence nothing judged counts. Bernoulli CUSUM of
  `mismatch_alarm_factor` × `max_mismatch_rate` against `max_mismatch_rate`; PASS when the
  Clopper–Pearson upper bound is within `max_mismatch_rate`. An 80 % mismatch rate
  alarms within about fifteen pairs.
- ties (greedy pairs): the share of pairs that diverged within the tie margin must stay
  at or below `max_tie_rate` (raised to the A/A control's divergence bound): a kernel
  that takes the runner-up of every close call diverges on nearly every output, each
  divergence a tie. Bernoulli CUSUM against the ceiling, on 1/16 of a detector's
  budget share (`gates.stats.budget.MINOR_SHARE`: its alternative is gross).
  Greedy output is a function of the prompt: the evidence names the distinct prompts
  behind each rate (a rate carried by a few prompts that repeat is theirs, not the
  deployment's).
- score: the paired task-score delta (speculative − baseline; only prompts with a check
  or reference score), a Gaussian CUSUM of mean −2 × `score_margin` against the edge
  −`score_margin`, with the window's sd of the deltas (at least 0.25). Deltas
  count by their size, so occasional tiny differences never add up to an alarm. PASS
  when the mean delta's lower t bound is at or above −`score_margin`.
- loops: speculative-only repetition loops; the edge is the baseline-only loop rate's
  upper bound plus `max_loop_rate`, the alarm twice that.
- distribution and argmax (sampled pairs the baseline model scored as teacher): a
  lossless arm keeps the target's output distribution, so the paired NLL difference has
  mean zero and neither arm's output is more often the argmax-heavier one
  (gates/pairs/distribution.py).
A check with nothing to judge (no scored prompts, no greedy pairs, no scored sampled
pairs) is left out.

An A/A control (`control_arm`, the baseline against a copy of itself) measures the
deployment's own greedy divergence floor where no teacher can tell ties from bugs: the
mismatch check's tolerance becomes the larger of `max_mismatch_rate` and the control's
divergence rate's 95 % upper bound over the same window.

With `by_category` (the switch policy's `scope = "category"`) every check runs on each
category's scored pairs alone: component `quality.<category>` holds that category's
checks (`quality.<category>.mismatch`, …), needs `min_samples` scored pairs of its own,
and each of its detectors gets the category's share of that detector's budget
(gates/pairs/categories.py), so a category whose answers got worse fails on its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gates.config import QualityGateConfig
from gates.core import GateDecision, GateState
from gates.pairs.categories import category_arl0, combine_categories, group_by_category
from gates.pairs.distribution import distribution_checks
from gates.records import PairRecord, PairScores
from gates.stats.budget import MINOR_SHARE
from gates.stats.descriptive import clopper_pearson, mean_t_bounds
from gates.stats.detectors import (
    CALIBRATION_CONFIDENCE,
    cusum_note,
    rate_alternatives,
    rate_check,
    reading,
    sequential_state,
)
from gates.stats.sequential import (
    cusum_bank,
    gaussian_llr,
    gross_charts,
    lorden_threshold,
    sd_upper_bound,
    shift_ladder,
)
from gates.window import Window, combined, decision, nodata, select

NAME = "quality"
_RATE_FLOOR = 1e-4
_LOOP_ALARM_FACTOR = 2.0  # the loop detector alarms on twice the tolerated rate
_SCORE_ALARM_FACTOR = 2.0  # the score detector alarms on a mean delta of twice the margin
# Task-score deltas are mostly 0 with rare ±1 (a check passed on one arm only): each delta
# is clipped to this many sds around the two means, so one such pair cannot alarm alone.
_SCORE_CLIP_SDS = 3.0
# The tie-rate chart's alternative is gross (nearly every greedy output a tie, each
# adding about 0.7 nats): it takes MINOR_SHARE of a detector's share (gates.budget counts
# it), so its threshold is h + log(1 / MINOR_SHARE).
_TIES_SHARE_LOG = -math.log(MINOR_SHARE)


def quality_gate(
    records: Sequence[PairRecord],
    config: QualityGateConfig,
    *,
    now: datetime,
    arl0: float,
    since: datetime | None = None,
    by_category: bool = False,
    control: Sequence[PairRecord] | None = None,
) -> GateDecision:
    """The worst of the mismatch, score, loop and distribution checks decides (per
    category, each on its own pairs, with `by_category`). `control`: the A/A control
    arm's pairs (baseline against itself), read over the same window."""
    window = select(records, config, now, since)
    floor = _control_floor(control, config, now)
    if by_category:
        by = group_by_category(window.records, _scored)
        if not by:
            return nodata(NAME, config, window, now, 0)
        counts = {c: len(v) for c, v in by.items()}
        decisions = []
        for category, pairs in by.items():
            name = f"{NAME}.{category}"
            checks, notes = _checks(
                name, config, window, now, pairs, category_arl0(counts, category, arl0), floor
            )
            decisions.append(
                combined(
                    name,
                    config,
                    window,
                    now,
                    checks,
                    [f"{category}: {note}" for note in notes],
                    category=category,
                )
            )
        return combine_categories(NAME, config, window, now, decisions)
    scored = [pair for r in window.records if (pair := _scored(r)) is not None]
    if not scored:
        return nodata(NAME, config, window, now, 0)
    components, notes = _checks(NAME, config, window, now, scored, arl0, floor)
    return combined(NAME, config, window, now, components, notes)


@dataclass(frozen=True, slots=True)
class _Floor:
    """The A/A control's greedy divergences over the window: count, pairs, upper bound."""

    divergent: int
    pairs: int
    upper: float


def _control_floor(
    control: Sequence[PairRecord] | None, config: QualityGateConfig, now: datetime
) -> _Floor | None:
    if control is None:
        return None
    window = select(control, config, now, None)
    greedy = [r.scores for r in window.records if r.scores is not None and r.temperature <= 0.0]
    if not greedy:
        return _Floor(0, 0, 0.0)
    divergent = sum(1 for s in greedy if not s.exact_match)
    _, upper = clopper_pearson(divergent, len(greedy), CALIBRATION_CONFIDENCE)
    return _Floor(divergent, len(greedy), upper)


def _scored(record: PairRecord) -> tuple[PairRecord, PairScores] | None:
    return None if record.scores is None else (record, record.scores)


def _checks(
    prefix: str,
    config: QualityGateConfig,
    window: Window,
    now: datetime,
    scored: list[tuple[PairRecord, PairScores]],
    arl0: float,
    floor: _Floor | None = None,
) -> tuple[list[GateDecision], list[str]]:
    """The checks of `scored` (at least one pair), named `<prefix>.<check>`, each at the
    threshold of `arl0`; and a note per check with nothing to judge."""
    h = lorden_threshold(arl0)
    components: list[GateDecision] = []
    notes: list[str] = []

    greedy_pairs = [(r, s) for r, s in scored if r.temperature <= 0.0]
    greedy = [s for _, s in greedy_pairs]
    if greedy:
        margin = config.tie_margin_nats
        real = [not s.exact_match and not s.tie(margin) for s in greedy]
        prompts = len({r.prompt.id for r, _ in greedy_pairs})
        real_prompts = len(
            {r.prompt.id for (r, _), hit in zip(greedy_pairs, real, strict=True) if hit}
        )
        edge = config.max_mismatch_rate
        control_note = ""
        if floor is not None:
            edge = max(edge, floor.upper) if floor.pairs else edge
            control_note = (
                f"; A/A control: {floor.divergent}/{floor.pairs} greedy pairs diverged "
                f"(upper bound {floor.upper:.4f}), tolerance {edge:.4f}"
                if floor.pairs
                else "; A/A control: no greedy pairs in the window yet"
            )
        tolerance = max(edge, _RATE_FLOOR)
        ties = sum(1 for s in greedy if s.tie(margin))
        unjudged = sum(1 for s in greedy if not s.exact_match and s.divergence_margin is None)
        first_only = sum(
            1 for s in greedy if not s.exact_match and s.divergence_judge in ("first", "bound")
        )
        components.append(
            rate_check(
                f"{prefix}.mismatch",
                config,
                window,
                now,
                # Numeric ties are not bugs; a divergence no teacher judged counts.
                hits=real,
                tolerance=edge,
                p0=tolerance,
                # A bank: the alternative next to the edge and gross ones at 4× and 16× it,
                # so a real verify bug (tens of percent) decides in tens of pairs.
                p1=rate_alternatives(
                    tolerance, min(config.mismatch_alarm_factor * tolerance, 0.99)
                ),
                h=h,
                statistic="greedy mismatch rate",
                note=f"; numeric ties {ties}/{len(greedy)} (within {margin:g} nats either "
                f"way, not counted); divergences nothing judged {unjudged} (counted); "
                f"judged at the first divergent token only (the baseline's top log-probs: "
                f"later tokens follow a prefix it never generated) {first_only}; "
                f"real divergences on {real_prompts} of {prompts} distinct prompts"
                f"{control_note}",
            )
        )
        tie_edge = max(config.max_tie_rate, floor.upper) if floor and floor.pairs else None
        tie_tolerance = tie_edge if tie_edge is not None else config.max_tie_rate
        components.append(
            rate_check(
                f"{prefix}.ties",
                config,
                window,
                now,
                hits=[s.tie(margin) for s in greedy],
                tolerance=tie_tolerance,
                p0=tie_tolerance,
                p1=rate_alternatives(tie_tolerance, min(2.0 * tie_tolerance, 0.99)),
                h=h + _TIES_SHARE_LOG,
                statistic="greedy tie rate",
                note=f"; ties within {margin:g} nats, on "
                f"{len({r.prompt.id for r, s in greedy_pairs if s.tie(margin)})} of "
                f"{prompts} distinct prompts",
            )
        )
    else:
        notes.append("mismatch: no greedy pairs (temperature > 0)")

    deltas = [d for _, s in scored if (d := s.task_score_delta) is not None]
    if deltas:
        components.append(_score(f"{prefix}.score", config, window, now, deltas, h))
    else:
        notes.append("score: no prompt in the window has a check or reference")

    sampled, sampled_notes = distribution_checks(prefix, config, window, now, scored, arl0)
    components.extend(sampled)
    notes.extend(sampled_notes)

    scores: list[PairScores] = [s for _, s in scored]
    n = len(scores)
    if not components:
        # Loops see only degeneration; garbage that does not repeat passes them. With no
        # content check (no greedy pair, no task check, no teacher-scored sampled pair:
        # every live pair, every server without a teacher) quality is never a PASS.
        components.append(
            decision(
                f"{prefix}.content",
                config,
                window,
                now,
                state=GateState.INCONCLUSIVE,
                statistic="content checks run",
                n_baseline=n,
                n_speculative=n,
                estimate=0.0,
                detail=f"no content check ran on {n} pairs (no greedy pair, no task check, "
                "no teacher-scored sampled pair): the loops check alone cannot PASS quality",
            )
        )
    baseline_only = sum(1 for s in scores if s.baseline_loop and not s.speculative_loop)
    _, baseline_upper = clopper_pearson(baseline_only, n, CALIBRATION_CONFIDENCE)
    p0 = min(max(baseline_upper, _RATE_FLOOR) + config.max_loop_rate, 0.5)
    components.append(
        rate_check(
            f"{prefix}.loops",
            config,
            window,
            now,
            hits=[s.speculative_loop and not s.baseline_loop for s in scores],
            tolerance=min(baseline_only / n + config.max_loop_rate, 1.0),
            p0=p0,
            p1=min(_LOOP_ALARM_FACTOR * p0, 0.99),
            h=h,
            statistic="speculative-only loop rate",
            note=f"; baseline-only loops {baseline_only}/{n}",
        )
    )
    return components, notes


def _score(
    name: str,
    config: QualityGateConfig,
    window: Window,
    now: datetime,
    deltas: list[float],
    h: float,
) -> GateDecision:
    n = len(deltas)
    better = sum(1 for d in deltas if d > 0)
    worse = sum(1 for d in deltas if d < 0)
    margin = max(config.score_margin, _RATE_FLOOR)
    spread = statistics.pstdev(deltas) if n >= 2 else 0.0
    sigma = max(spread, margin)
    mu0, mu1 = -margin, -_SCORE_ALARM_FACTOR * margin
    clipped = [
        min(max(d, mu1 - _SCORE_CLIP_SDS * sigma), mu0 + _SCORE_CLIP_SDS * sigma) for d in deltas
    ]
    # Gross charts (mean delta −4, −16 … × margin, down to −1, the most a score can
    # drop), at a scale no smaller than the window's sd's upper bound: a handful of pairs
    # that all lost their check decide.
    gross_sigma = max(sd_upper_bound(deltas, CALIBRATION_CONFIDENCE), sigma)
    gross = [-s for s in shift_ladder(margin, 1.0)[1:]]
    charts = [gaussian_llr(clipped, mu0, mu1, sigma)]
    charts += gross_charts(deltas, mu0, gross, gross_sigma, clip_sds=_SCORE_CLIP_SDS)
    cusum, chart, h = cusum_bank(charts, h)
    alternative = mu1 if chart == 0 else mu0 + gross[chart - 1]
    threshold = -config.score_margin
    mean, lower, upper = mean_t_bounds(deltas, config.confidence)
    state = sequential_state(
        cusum,
        h,
        n,
        max(2, config.min_samples),
        passed=lower >= threshold,
        warned=mean < threshold,
    )
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic="mean task-score delta speculative − baseline",
        n_baseline=n,
        n_speculative=n,
        estimate=mean,
        lower=lower,
        upper=upper,
        threshold=threshold,
        detail=f"score delta {mean:+.4f} [{lower:+.4f}, {upper:+.4f}] vs margin "
        f"{threshold:+g} ({n} scored pairs: {worse} worse, {better} better); "
        f"{cusum_note(cusum, h)} for mean delta {-margin:+.4g} → "
        f"{alternative:+.4g} (chart {chart + 1} of {len(charts)}), sd {sigma:.4g}",
        detector=reading(cusum, h),
    )
