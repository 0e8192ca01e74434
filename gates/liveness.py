"""The liveness gate: is there enough fresh data, and is the speculative arm alive?

NODATA below `min_samples` pairs in the window (a stalled canary is never a PASS). FAIL
when the speculative arm has failed on each of the last `max_consecutive_failures` pairs
while the baseline succeeded on every one of them, or when its failure rate on the
window's pairs where the baseline succeeded exceeds the baseline's own failure rate over
the window by `max_failure_rate` or more: a dead speculative arm should roll back at once,
so this gate is critical by default. If every pair failed on the baseline, INCONCLUSIVE.

Both rules allow for a shared outage (a gateway, a network, a shared node), which fails
each arm on its own too: a pair where the baseline failed ends a run, the rate is judged
against the baseline's, and where the baseline fails a share q of the window's pairs the
run needed grows to the length that equal arms failing at q reach with probability at
most RUN_ALPHA per pair, (q (1 − q))^k ≤ 1e-6: 5 pairs up to q ≈ 6 %, 9 at q = 30 %.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from gates.config import LivenessGateConfig
from gates.core import GateDecision, GateState
from gates.records import PairRecord
from gates.window import decision, nodata, select

NAME = "liveness"
RUN_ALPHA = 1e-6  # a run of speculative-only failures this improbable for equal arms


def liveness_gate(
    records: Sequence[PairRecord], config: LivenessGateConfig, *, now: datetime
) -> GateDecision:
    """FAIL on a run of speculative-only failures or a high speculative-only failure rate."""
    window = select(records, config, now)
    n = len(window.records)
    if n < config.min_samples:
        return nodata(NAME, config, window, now, n)
    judged = [r for r in window.records if r.baseline.ok]
    streak = 0
    for record in reversed(window.records):
        if record.speculative.ok or not record.baseline.ok:
            break
        streak += 1
    failures = sum(1 for r in judged if not r.speculative.ok)
    rate = failures / len(judged) if judged else None
    baseline_rate = 1.0 - len(judged) / n
    run_needed = needed_run(config.max_consecutive_failures, baseline_rate)
    if not judged:
        state = GateState.INCONCLUSIVE
    elif streak >= run_needed or (
        rate is not None and rate - baseline_rate >= config.max_failure_rate
    ):
        state = GateState.FAIL
    elif streak >= 2:
        state = GateState.WARN
    else:
        state = GateState.PASS
    return decision(
        NAME,
        config,
        window,
        now,
        state=state,
        statistic="trailing speculative-only failures",
        n_baseline=len(judged),
        n_speculative=n,
        estimate=float(streak),
        threshold=float(run_needed),
        detail=f"{streak} consecutive speculative-only failures (max {run_needed - 1}); "
        f"{failures}/{len(judged)} pairs with a healthy baseline failed on speculative "
        f"(max: the baseline's own rate {baseline_rate:.2f} + {config.max_failure_rate:g}); "
        f"{n - len(judged)} pairs with a failed baseline left out",
    )


def needed_run(minimum: int, baseline_rate: float) -> int:
    """The run of speculative-only failures that FAILs: `minimum`, or longer where the
    baseline fails often enough that equal arms would make such runs by chance (each pair
    speculative-only with probability q (1 − q) at a baseline failure rate q)."""
    chance = baseline_rate * (1.0 - baseline_rate)
    if chance <= 0.0:
        return minimum
    return max(minimum, math.ceil(math.log(RUN_ALPHA) / math.log(chance)))
