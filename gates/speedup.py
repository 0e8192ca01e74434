"""The speedup gate: is the speculative arm actually faster?

Per pair, speedup = baseline e2e / speculative e2e; the gate bounds the median speedup
with distribution-free binomial order statistics (no assumption on the shape of the
speedup distribution, which is skewed and prompt-dependent) and needs the lower bound
at or above `min_speedup` to PASS; FAIL when even the upper bound is below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from canaryd.records import PairRecord
from gates.config import SpeedupGateConfig
from gates.core import GateDecision, bound_state
from gates.stats import order_statistic_bounds, quantile
from gates.window import decision, nodata, select

NAME = "speedup"


def speedup_gate(
    records: Sequence[PairRecord], config: SpeedupGateConfig, *, now: datetime
) -> GateDecision:
    """PASS when the median speedup's lower bound ≥ min_speedup; FAIL when its upper
    bound < min_speedup."""
    window = select(records, config, now)
    speedups = [s for r in window.records if (s := r.speedup) is not None]
    n = len(speedups)
    if n < config.min_samples:
        return nodata(NAME, config, window, now, n)
    median = quantile(speedups, 0.5)
    assert median is not None  # n ≥ min_samples ≥ 1
    lower, upper = order_statistic_bounds(speedups, 0.5, config.confidence)
    state = bound_state(
        estimate=median,
        lower=lower,
        upper=upper,
        threshold=config.min_speedup,
        higher_is_worse=False,
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
        f"vs min {config.min_speedup:g} (binomial order statistics, {n} pairs)",
    )


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"
