"""The quality gate: does the speculative arm answer as well as the baseline?

Three detectors on the scored pairs of the window (pairs where both arms succeeded),
oldest first:
- mismatch (greedy pairs only, temperature 0): a lossless speculative decoder reproduces
  greedy output exactly, so a mismatch is a bug or numerical noise. Bernoulli CUSUM of
  `mismatch_alarm_factor` × `max_mismatch_rate` against `max_mismatch_rate`; PASS when the
  Clopper–Pearson upper bound is within `max_mismatch_rate`. An 80 % mismatch rate
  alarms within about fifteen pairs.
- score: pairs where the speculative arm's task score is lower than the baseline's,
  against pairs where it is higher (only prompts with a check or reference score). The
  in-control rate of "speculative worse" is the upper bound of "speculative better";
  the alternative adds `score_margin`. PASS when the mean score delta's lower t bound is
  at or above −`score_margin`.
- loops: speculative-only repetition loops, the same paired construction against
  baseline-only loops with `max_loop_rate` as the excess that matters.
A check with nothing to judge (no scored prompts, no greedy pairs) is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gates.budget import DEFAULT_ARL0
from gates.config import QualityGateConfig
from gates.core import GateDecision
from gates.detectors import bernoulli_increments, cusum_note, rate_check, sequential_state
from gates.records import PairRecord, PairScores
from gates.sequential import llr_cusum, lorden_threshold
from gates.stats import clopper_pearson, mean_t_bounds
from gates.window import Window, combined, decision, nodata, select

NAME = "quality"
_RATE_FLOOR = 1e-4


def quality_gate(
    records: Sequence[PairRecord],
    config: QualityGateConfig,
    *,
    now: datetime,
    arl0: float = DEFAULT_ARL0,
    since: datetime | None = None,
) -> GateDecision:
    """The worst of the mismatch, score and loop checks decides."""
    window = select(records, config, now, since)
    scored = [(r, r.scores) for r in window.records if r.scores is not None]
    if not scored:
        return nodata(NAME, config, window, now, 0)
    h = lorden_threshold(arl0)
    components: list[GateDecision] = []
    notes: list[str] = []

    greedy = [s for r, s in scored if r.temperature <= 0.0]
    if greedy:
        tolerance = max(config.max_mismatch_rate, _RATE_FLOOR)
        components.append(
            rate_check(
                f"{NAME}.mismatch",
                config,
                window,
                now,
                hits=[not s.exact_match for s in greedy],
                tolerance=config.max_mismatch_rate,
                p0=tolerance,
                p1=min(config.mismatch_alarm_factor * tolerance, 0.99),
                h=h,
                statistic="greedy mismatch rate",
            )
        )
    else:
        notes.append("mismatch: no greedy pairs (temperature > 0)")

    deltas = [d for _, s in scored if (d := s.task_score_delta) is not None]
    if deltas:
        components.append(_score(config, window, now, deltas, h))
    else:
        notes.append("score: no prompt in the window has a check or reference")

    scores: list[PairScores] = [s for _, s in scored]
    n = len(scores)
    baseline_only = sum(1 for s in scores if s.baseline_loop and not s.speculative_loop)
    _, baseline_upper = clopper_pearson(baseline_only, n, config.confidence)
    p0 = min(max(baseline_upper, _RATE_FLOOR), 0.5)
    components.append(
        rate_check(
            f"{NAME}.loops",
            config,
            window,
            now,
            hits=[s.speculative_loop and not s.baseline_loop for s in scores],
            tolerance=min(baseline_only / n + config.max_loop_rate, 1.0),
            p0=p0,
            p1=min(p0 + max(config.max_loop_rate, _RATE_FLOOR), 0.99),
            h=h,
            statistic="speculative-only loop rate",
            note=f"; baseline-only loops {baseline_only}/{n}",
        )
    )
    return combined(NAME, config, window, now, components, notes)


def _score(
    config: QualityGateConfig, window: Window, now: datetime, deltas: list[float], h: float
) -> GateDecision:
    name = f"{NAME}.score"
    n = len(deltas)
    better = sum(1 for d in deltas if d > 0)
    worse = sum(1 for d in deltas if d < 0)
    _, better_upper = clopper_pearson(better, n, config.confidence)
    p0 = min(max(better_upper, _RATE_FLOOR), 0.5)
    p1 = min(p0 + max(config.score_margin, _RATE_FLOOR), 0.99)
    cusum = llr_cusum(bernoulli_increments([d < 0 for d in deltas], p0, p1), h)
    threshold = -config.score_margin
    if n >= 2:
        mean, lower, upper = mean_t_bounds(deltas, config.confidence)
    else:
        mean, lower, upper = deltas[0], float("-inf"), float("inf")
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
        f"{cusum_note(cusum, h)} for worse-rate {p0:.4g} → {p1:.4g}",
    )
