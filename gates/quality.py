"""The quality gate: does the speculative arm answer as well as the baseline?

Three checks on the scored pairs of the window (pairs where both arms succeeded):
- score: non-inferiority of the paired task-score delta (speculative − baseline). PASS
  when the mean's lower t bound is ≥ −`score_margin`, FAIL when even its upper bound is
  below it. Only prompts with a check or reference have a task score.
- mismatch (greedy pairs only, temperature 0): the rate of pairs whose outputs differ.
  A lossless speculative decoder reproduces greedy output exactly, so any excess over
  `max_mismatch_rate` is a bug; Clopper–Pearson bounds, FAIL when the lower one exceeds it.
- loops: the rate of pairs where only the speculative output degenerated into a
  repetition loop, Clopper–Pearson against `max_loop_rate`.
A check with nothing to judge (no scored prompts, no greedy pairs) is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from canaryd.records import PairRecord, PairScores
from gates.config import QualityGateConfig
from gates.core import GateDecision, bound_state
from gates.stats import clopper_pearson, mean_t_bounds
from gates.window import Window, combined, decision, nodata, select

NAME = "quality"


def quality_gate(
    records: Sequence[PairRecord], config: QualityGateConfig, *, now: datetime
) -> GateDecision:
    """The worst of the score, mismatch and loop checks decides."""
    window = select(records, config, now)
    scored = [(r, r.scores) for r in window.records if r.scores is not None]
    if len(scored) < config.min_samples:
        return nodata(NAME, config, window, now, len(scored))
    components: list[GateDecision] = []
    notes: list[str] = []

    deltas = [d for _, s in scored if (d := s.task_score_delta) is not None]
    if deltas:
        components.append(_score(config, window, now, deltas))
    else:
        notes.append("score: no prompt in the window has a check or reference")

    greedy = [s for r, s in scored if r.temperature <= 0.0]
    if greedy:
        mismatches = sum(1 for s in greedy if not s.exact_match)
        components.append(
            _rate_check(
                "mismatch",
                "greedy mismatch rate",
                config.max_mismatch_rate,
                mismatches,
                len(greedy),
                config,
                window,
                now,
            )
        )
    else:
        notes.append("mismatch: no greedy pairs (temperature > 0)")

    scores: list[PairScores] = [s for _, s in scored]
    loops = sum(1 for s in scores if s.speculative_loop and not s.baseline_loop)
    components.append(
        _rate_check(
            "loops",
            "speculative-only loop rate",
            config.max_loop_rate,
            loops,
            len(scores),
            config,
            window,
            now,
        )
    )
    return combined(NAME, config, window, now, components, notes)


def _score(
    config: QualityGateConfig, window: Window, now: datetime, deltas: list[float]
) -> GateDecision:
    name = f"{NAME}.score"
    n = len(deltas)
    if n < max(2, config.min_samples):
        return nodata(name, config, window, now, n)
    mean, lower, upper = mean_t_bounds(deltas, config.confidence)
    threshold = -config.score_margin
    return decision(
        name,
        config,
        window,
        now,
        state=bound_state(
            estimate=mean, lower=lower, upper=upper, threshold=threshold, higher_is_worse=False
        ),
        statistic="mean task-score delta speculative − baseline",
        n_baseline=n,
        n_speculative=n,
        estimate=mean,
        lower=lower,
        upper=upper,
        threshold=threshold,
        detail=f"score delta {mean:+.4f} [{lower:+.4f}, {upper:+.4f}] vs margin "
        f"{threshold:+g} (t bound, {n} scored pairs)",
    )


def _rate_check(
    check: str,
    statistic: str,
    tolerance: float,
    hits: int,
    n: int,
    config: QualityGateConfig,
    window: Window,
    now: datetime,
) -> GateDecision:
    name = f"{NAME}.{check}"
    if n < config.min_samples:
        return nodata(name, config, window, now, n)
    rate = hits / n
    lower, upper = clopper_pearson(hits, n, config.confidence)
    return decision(
        name,
        config,
        window,
        now,
        state=bound_state(
            estimate=rate, lower=lower, upper=upper, threshold=tolerance, higher_is_worse=True
        ),
        statistic=statistic,
        n_baseline=n,
        n_speculative=n,
        estimate=rate,
        lower=lower,
        upper=upper,
        threshold=tolerance,
        detail=f"{statistic} {hits}/{n} = {rate:.4f} [{lower:.4f}, {upper:.4f}] "
        f"vs max {tolerance:g} (Clopper–Pearson)",
    )
