"""The latency gate: speculative vs baseline quantiles of e2e, TTFT and TPOT.

One decision for the gate, with one component per (metric, quantile) ratio and per
absolute SLO. The ratio's bounds come from a seeded paired bootstrap (pairs resampled
together); an SLO's bounds are distribution-free order statistics of the speculative arm.
Only pairs where both arms succeeded count: failures belong to the error gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from canaryd.records import PairRecord
from engine.types import GenerationResult
from gates.config import LatencyGateConfig, LatencyMetric
from gates.core import GateDecision, bound_state
from gates.stats import order_statistic_bounds, paired_bootstrap_quantile_ratio, quantile
from gates.window import Window, combined, decision, nodata, select

NAME = "latency"


def _metric(result: GenerationResult, metric: LatencyMetric) -> float | None:
    value = {"e2e": result.e2e_s, "ttft": result.ttft_s, "tpot": result.tpot_s}[metric]
    return value if value is not None and value > 0 else None


def _pct(q: float) -> str:
    return f"p{q * 100:g}"


def latency_gate(
    records: Sequence[PairRecord], config: LatencyGateConfig, *, now: datetime
) -> GateDecision:
    """Ratio FAIL when its lower bound exceeds `max_ratio`, PASS when its upper bound is
    at or below it; SLO FAIL when the speculative quantile's lower bound exceeds it."""
    window = select(records, config, now)
    complete = [r for r in window.records if r.complete]
    if len(complete) < config.min_samples:
        return nodata(NAME, config, window, now, len(complete))
    components: list[GateDecision] = []
    skipped: list[str] = []
    for metric in config.metrics:
        paired = [
            (b, s)
            for r in complete
            if (b := _metric(r.baseline, metric)) is not None
            and (s := _metric(r.speculative, metric)) is not None
        ]
        if not paired:
            skipped.append(f"{metric} not reported")
            continue
        for q in config.quantiles:
            components.append(_ratio(config, window, now, metric, q, paired))
    for slo in config.slos:
        values = [v for r in complete if (v := _metric(r.speculative, slo.metric)) is not None]
        if not values:
            skipped.append(f"{slo.metric} SLO: not reported")
            continue
        components.append(
            _slo(config, window, now, slo.metric, slo.quantile, slo.max_seconds, values)
        )
    if not components:
        return nodata(NAME, config, window, now, 0)
    return combined(NAME, config, window, now, components, skipped)


def _ratio(
    config: LatencyGateConfig,
    window: Window,
    now: datetime,
    metric: LatencyMetric,
    q: float,
    paired: list[tuple[float, float]],
) -> GateDecision:
    name = f"{NAME}.{metric}.{_pct(q)}"
    n = len(paired)
    if n < config.min_samples:
        return nodata(name, config, window, now, n)
    estimate, lower, upper = paired_bootstrap_quantile_ratio(
        [b for b, _ in paired],
        [s for _, s in paired],
        q,
        confidence=config.confidence,
        resamples=config.bootstrap_resamples,
        seed=config.bootstrap_seed,
    )
    state = bound_state(
        estimate=estimate,
        lower=lower,
        upper=upper,
        threshold=config.max_ratio,
        higher_is_worse=True,
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
        f"[{lower:.3f}, {upper:.3f}] vs max {config.max_ratio:g} (paired bootstrap)",
    )


def _slo(
    config: LatencyGateConfig,
    window: Window,
    now: datetime,
    metric: LatencyMetric,
    q: float,
    max_seconds: float,
    values: list[float],
) -> GateDecision:
    name = f"{NAME}.{metric}.{_pct(q)}.slo"
    n = len(values)
    if n < config.min_samples:
        return nodata(name, config, window, now, n)
    lower, upper = order_statistic_bounds(values, q, config.confidence)
    estimate = quantile(values, q)
    assert estimate is not None  # values is non-empty
    state = bound_state(
        estimate=estimate, lower=lower, upper=upper, threshold=max_seconds, higher_is_worse=True
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
        f"[{_fmt(lower)}, {_fmt(upper)}] vs SLO {max_seconds:g}s (order statistics)",
    )


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"
