"""The error-rate gate: is the speculative arm failing more often than the baseline?

Two checks on the same window. Paired: an exact one-sided McNemar test on the discordant
pairs (only speculative failed vs only baseline failed); FAIL needs both significance and
an excess of at least `max_excess_rate`, so a huge window cannot fail on a trivial
difference. Absolute: Clopper–Pearson bounds on the speculative error rate against
`max_error_rate`; PASS needs the upper bound under the ceiling (positive evidence).
A timeout, an HTTP error, an OOM or an invalid response all count as errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from canaryd.records import PairRecord
from gates.config import ErrorGateConfig
from gates.core import GateDecision, GateState, bound_state
from gates.stats import clopper_pearson, mcnemar_exact_greater
from gates.window import combined, decision, nodata, select

NAME = "error"


def error_gate(
    records: Sequence[PairRecord], config: ErrorGateConfig, *, now: datetime
) -> GateDecision:
    """FAIL when the paired excess is significant and ≥ max_excess_rate, or the
    speculative error rate's lower bound is above max_error_rate."""
    window = select(records, config, now)
    n = len(window.records)
    if n < config.min_samples:
        return nodata(NAME, config, window, now, n)
    only_speculative = sum(1 for r in window.records if r.baseline.ok and not r.speculative.ok)
    only_baseline = sum(1 for r in window.records if not r.baseline.ok and r.speculative.ok)
    speculative_errors = sum(1 for r in window.records if not r.speculative.ok)
    baseline_errors = sum(1 for r in window.records if not r.baseline.ok)

    p_value = mcnemar_exact_greater(only_speculative, only_baseline)
    excess = (only_speculative - only_baseline) / n
    alpha = 1.0 - config.confidence
    if p_value < alpha and excess >= config.max_excess_rate:
        paired_state = GateState.FAIL
    elif excess >= config.max_excess_rate:
        paired_state = GateState.WARN  # large enough to matter, not yet significant
    else:
        paired_state = GateState.PASS
    paired = decision(
        f"{NAME}.paired",
        config,
        window,
        now,
        state=paired_state,
        statistic="excess error rate speculative − baseline (McNemar exact p in detail)",
        n_baseline=n,
        n_speculative=n,
        estimate=excess,
        threshold=config.max_excess_rate,
        detail=f"discordant: {only_speculative} speculative-only vs {only_baseline} "
        f"baseline-only failures in {n} pairs, excess {excess:.4f}, "
        f"McNemar one-sided p={p_value:.3g} (alpha {alpha:g})",
    )

    rate = speculative_errors / n
    lower, upper = clopper_pearson(speculative_errors, n, config.confidence)
    ceiling = decision(
        f"{NAME}.ceiling",
        config,
        window,
        now,
        state=bound_state(
            estimate=rate,
            lower=lower,
            upper=upper,
            threshold=config.max_error_rate,
            higher_is_worse=True,
        ),
        statistic="speculative error rate",
        n_baseline=n,
        n_speculative=n,
        estimate=rate,
        lower=lower,
        upper=upper,
        threshold=config.max_error_rate,
        detail=f"speculative errors {speculative_errors}/{n} = {rate:.4f} "
        f"[{lower:.4f}, {upper:.4f}] vs ceiling {config.max_error_rate:g} (Clopper–Pearson); "
        f"baseline errors {baseline_errors}/{n}",
    )
    return combined(NAME, config, window, now, [paired, ceiling])
