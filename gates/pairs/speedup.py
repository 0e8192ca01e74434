"""The speedup gate: is the speculative arm actually faster?

Per pair, speedup = baseline e2e / speculative e2e. FAIL comes from a sign detector: at
a median speedup of exactly `min_speedup` half of the pairs are slower than it, so a
Bernoulli CUSUM of `alarm_slower_share` against 0.5 on "this pair was slower than
`min_speedup`" alarms only when the arm is clearly slower, with no assumption on the
shape of the speedup distribution (skewed and prompt-dependent). PASS when the median's
distribution-free lower bound (binomial order statistics) is at or above `min_speedup`.

With `by_category` (the switch policy's `scope = "category"`) the same check runs on each
category's pairs alone, as component `speedup.<category>` with `min_samples` pairs per
category and its share of the detector's budget (gates/pairs/categories.py): a category whose
speculative arm is slower fails on its own, however fast the others are.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gates.config import SpeedupGateConfig
from gates.core import GateDecision, GateState
from gates.pairs.categories import category_arl0, combine_categories, group_by_category
from gates.records import PairRecord
from gates.stats.descriptive import order_statistic_bounds, quantile
from gates.stats.detectors import bernoulli_increments, cusum_note, reading, sequential_state
from gates.stats.sequential import llr_cusum, lorden_threshold
from gates.window import Window, decision, nodata, select

NAME = "speedup"


def speedup_gate(
    records: Sequence[PairRecord],
    config: SpeedupGateConfig,
    *,
    now: datetime,
    arl0: float,
    since: datetime | None = None,
    by_category: bool = False,
) -> GateDecision:
    """FAIL when the sign detector alarms; PASS when the median speedup's lower bound ≥
    min_speedup (per category, each on its own pairs, with `by_category`)."""
    window = select(records, config, now, since)
    if by_category:
        by = group_by_category(window.records, lambda r: r.speedup)
        if not by:
            return nodata(NAME, config, window, now, 0)
        counts = {c: len(v) for c, v in by.items()}
        components = [
            _check(
                f"{NAME}.{category}",
                config,
                window,
                now,
                values,
                lorden_threshold(category_arl0(counts, category, arl0)),
                category=category,
            )
            for category, values in by.items()
        ]
        return combine_categories(NAME, config, window, now, components)
    speedups = [s for r in window.records if (s := r.speedup) is not None]
    if not speedups:
        return nodata(NAME, config, window, now, 0)
    return _check(NAME, config, window, now, speedups, lorden_threshold(arl0))


def _check(
    name: str,
    config: SpeedupGateConfig,
    window: Window,
    now: datetime,
    speedups: list[float],
    h: float,
    category: str | None = None,
) -> GateDecision:
    n = len(speedups)
    slower = [s < config.min_speedup for s in speedups]
    cusum = llr_cusum(bernoulli_increments(slower, 0.5, config.alarm_slower_share), h)
    median = quantile(speedups, 0.5)
    assert median is not None  # n ≥ 1
    lower, upper = order_statistic_bounds(speedups, 0.5, config.confidence)
    state = sequential_state(
        cusum,
        h,
        n,
        config.min_samples,
        passed=lower is not None and lower >= config.min_speedup,
        warned=median < config.min_speedup,
    )
    where = f"{category}: " if category is not None else ""
    return decision(
        name,
        config,
        window,
        now,
        state=state,
        statistic="median speedup baseline e2e / speculative e2e",
        n_baseline=n,
        n_speculative=n,
        estimate=median,
        lower=lower,
        upper=upper,
        threshold=config.min_speedup,
        detail=f"{where}median speedup {median:.3f} [{_fmt(lower)}, {_fmt(upper)}] "
        f"vs min {config.min_speedup:g} (binomial order statistics, {n} pairs, "
        f"{sum(slower)} slower); {cusum_note(cusum, h)} for slower-share 0.5 → "
        f"{config.alarm_slower_share:g}",
        categories=(category,) if category is not None and state is not GateState.PASS else (),
        category=category,
        detector=reading(cusum, h),
    )


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"
