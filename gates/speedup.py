"""The speedup gate: is the speculative arm actually faster?

Per pair, speedup = baseline e2e / speculative e2e. FAIL comes from a sign detector: at
a median speedup of exactly `min_speedup` half of the pairs are slower than it, so a
Bernoulli CUSUM of `alarm_slower_share` against 0.5 on "this pair was slower than
`min_speedup`" alarms only when the arm is clearly slower, with no assumption on the
shape of the speedup distribution (skewed and prompt-dependent). PASS when the median's
distribution-free lower bound (binomial order statistics) is at or above `min_speedup`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gates.budget import DEFAULT_ARL0
from gates.config import SpeedupGateConfig
from gates.core import GateDecision
from gates.detectors import bernoulli_increments, cusum_note, sequential_state
from gates.records import PairRecord
from gates.sequential import llr_cusum, lorden_threshold
from gates.stats import order_statistic_bounds, quantile
from gates.window import decision, nodata, select

NAME = "speedup"


def speedup_gate(
    records: Sequence[PairRecord],
    config: SpeedupGateConfig,
    *,
    now: datetime,
    arl0: float = DEFAULT_ARL0,
    since: datetime | None = None,
) -> GateDecision:
    """FAIL when the sign detector alarms; PASS when the median speedup's lower bound ≥
    min_speedup."""
    window = select(records, config, now, since)
    speedups = [s for r in window.records if (s := r.speedup) is not None]
    n = len(speedups)
    if n == 0:
        return nodata(NAME, config, window, now, 0)
    h = lorden_threshold(arl0)
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
    return decision(
        NAME,
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
        detail=f"median speedup {median:.3f} [{_fmt(lower)}, {_fmt(upper)}] "
        f"vs min {config.min_speedup:g} (binomial order statistics, {n} pairs, "
        f"{sum(slower)} slower); {cusum_note(cusum, h)} for slower-share 0.5 → "
        f"{config.alarm_slower_share:g}",
    )


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"
