"""The liveness gate: is there enough fresh data, and is the speculative arm alive?

NODATA below `min_samples` pairs in the window (a stalled canary is never a PASS). FAIL
when the speculative arm has failed on each of the last `max_consecutive_failures` pairs
while the baseline succeeded on every one of them, or on at least `max_failure_rate` of
the window's pairs where the baseline succeeded: a dead speculative arm should roll back
at once, so this gate is critical by default. A pair where the baseline failed ends the
run: failures on both arms around the same time are a shared outage (a gateway, a
network), not a dead arm, and an outage makes each arm fail alone too. Those pairs are
left out of the rate, and the rate FAILs only at `baseline_factor` times the baseline's
own failure rate over the window or more (inside an outage that fails the baseline on 40 %
of the pairs, the speculative arm fails on about 40 % of the rest too); if every pair
failed on the baseline, INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gates.config import LivenessGateConfig
from gates.core import GateDecision, GateState
from gates.records import PairRecord
from gates.window import decision, nodata, select

NAME = "liveness"


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
    if not judged:
        state = GateState.INCONCLUSIVE
    elif streak >= config.max_consecutive_failures or (
        rate is not None
        and rate >= config.max_failure_rate
        and rate >= config.baseline_factor * baseline_rate
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
        threshold=float(config.max_consecutive_failures),
        detail=f"{streak} consecutive speculative-only failures (max "
        f"{config.max_consecutive_failures - 1}); {failures}/{len(judged)} pairs with a "
        f"healthy baseline failed on speculative (max rate {config.max_failure_rate:g}, "
        f"and {config.baseline_factor:g} × the baseline's own {baseline_rate:.2f}); "
        f"{n - len(judged)} pairs with a failed baseline left out",
    )
