"""The liveness gate: is there enough fresh data, and is the speculative arm alive?

NODATA below `min_samples` pairs in the window (a stalled canary is never a PASS). FAIL
when there is no speculative success among the last k pairs where the baseline
succeeded: a dead speculative arm should roll back at once, so this gate is critical by
default. If every pair failed on the baseline, INCONCLUSIVE.

Pairs where the baseline failed are skipped, neither counted nor ending the run: they
say nothing about the speculative arm, and a baseline that fails most of its requests
must not hide a dead arm beside it. The rule is a CUSUM whose alternative is a dead arm:
under equal arms a speculative failure where the baseline succeeded has probability at
most q, the baseline's failure rate (equal arms on shared infrastructure fail together
more often than apart, never less), so a run of k has probability q^k and the run needed
is the smallest k ≥ `max_consecutive_failures` with k · log(1/q) ≥ h, h = log(ARL0) of
liveness's own share of the false-alarm budget, 1/16 of a detector's (gates/stats/budget.py:
a dead arm's alternative is gross; h ≈ 20.3): 5 pairs up to q ≈ 1.7 %, 6 at 3 %, 9 at
10 %, 17 at 30 %, 57 at 70 %. q is the baseline's failure rate over the run's
own pairs, or over the newest `rate_pairs` pairs where that is higher or the run is
shorter: it follows a burst of shared failures, and a long run beside a flaky baseline
is judged on all of its pairs. A run of two WARNs, and so does a speculative failure rate
where the baseline succeeded past the baseline's own failure rate by `max_failure_rate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from gates.config import LivenessGateConfig
from gates.core import GateDecision, GateState
from gates.records import PairRecord
from gates.stats.budget import MINOR_SHARE
from gates.stats.sequential import lorden_threshold
from gates.window import decision, nodata, select

NAME = "liveness"
_NEVER = 2**31  # the run needed beside a baseline that failed every recent request


def liveness_gate(
    records: Sequence[PairRecord],
    config: LivenessGateConfig,
    *,
    now: datetime,
    arl0: float,
) -> GateDecision:
    """FAIL when the last k pairs where the baseline succeeded all failed on the
    speculative arm (k from the baseline's failure rate and liveness's budget share)."""
    window = select(records, config, now)
    pairs = window.records
    n = len(pairs)
    if n < config.min_samples:
        return nodata(NAME, config, window, now, n)
    run, start = trailing_run(pairs)
    span = pairs[start:]
    recent = pairs[-max(config.rate_pairs, len(span)) :]
    recent_rate = sum(1 for r in recent if not r.baseline.ok) / len(recent)
    run_rate = sum(1 for r in span if not r.baseline.ok) / len(span) if span else 0.0
    baseline_rate = max(recent_rate, run_rate)
    h = liveness_threshold(arl0)
    run_needed = needed_run(config.max_consecutive_failures, baseline_rate, h)
    judged = [r for r in pairs if r.baseline.ok]
    failures = sum(1 for r in judged if not r.speculative.ok)
    window_rate = 1.0 - len(judged) / n
    rate = failures / len(judged) if judged else 0.0
    if not judged:
        state = GateState.INCONCLUSIVE
    elif run >= run_needed:
        state = GateState.FAIL
    elif run >= 2 or rate - window_rate >= config.max_failure_rate:
        state = GateState.WARN
    else:
        state = GateState.PASS
    return decision(
        NAME,
        config,
        window,
        now,
        state=state,
        statistic="speculative failures in a row where the baseline succeeded",
        n_baseline=len(judged),
        n_speculative=n,
        estimate=float(run),
        threshold=float(run_needed),
        detail=f"the last {run} pairs where the baseline succeeded failed on speculative "
        f"(FAIL at {run_needed}: the baseline fails {baseline_rate:.2f} of the newest pairs, "
        f"h {h:.2f}; {len(span) - run} pairs where the baseline failed skipped); "
        f"{failures}/{len(judged)} pairs with a healthy baseline failed on speculative "
        f"(WARN past the baseline's own rate {window_rate:.2f} + {config.max_failure_rate:g})",
    )


def liveness_threshold(arl0: float) -> float:
    """Liveness's h: log of its ARL0, `MINOR_SHARE` of a detector's share (`arl0`, a
    whole share's ARL0, gates.stats.budget.detector_arl0): a dead arm's alternative is gross."""
    return lorden_threshold(arl0 / MINOR_SHARE)


def trailing_run(pairs: Sequence[PairRecord]) -> tuple[int, int]:
    """(k, i): the newest pairs where the baseline succeeded, k of them, all failed on the
    speculative arm, the oldest at index i (len(pairs) when k = 0); pairs where the
    baseline failed are skipped."""
    run, start = 0, len(pairs)
    for index in range(len(pairs) - 1, -1, -1):
        record = pairs[index]
        if not record.baseline.ok:
            continue
        if record.speculative.ok:
            break
        run, start = run + 1, index
    return run, start


def needed_run(minimum: int, baseline_rate: float, h: float) -> int:
    """The run that FAILs: the smallest k ≥ `minimum` with k · log(1/q) ≥ h, q the
    baseline's failure rate (a run of k has probability at most q^k for equal arms).
    A baseline that always fails allows no run: nothing is learnt beside it."""
    if baseline_rate <= 0.0:
        return minimum
    if baseline_rate >= 1.0:
        return _NEVER
    return max(minimum, math.ceil(h / -math.log(baseline_rate)))
