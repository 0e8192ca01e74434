"""When a rollout tool may grow a revision's traffic (Flagger's `confirm-traffic-increase`).

Traffic grows on evidence, never on liveness alone. Yes only when the verdict is fresh and
not FAIL, no enforce gate is WARN or FAIL (a pair gate that an enforced telemetry gate
covers counts only by its FAIL, as in the verdict), and each of the error, latency and
quality gates (`INCREASE_GATES`) has evidence from the revision since the last increase:

- its decision on the revision's evidence is not NODATA (it has its `min_samples`), and
- the revision measured, after the last confirmed increase (or its evidence start), at
  least `rollout.increase_evidence_share` × the gate's `min_samples` new pairs (`needed`):
  with the defaults 10 for error and quality, 30 for latency, at the current weight;
- for a gate an enforced telemetry gate covers (error by `telemetry.errors`, latency by
  `telemetry.latency`), that telemetry gate's decision and the speculative arm's
  production requests stand in for it: not NODATA, and the share of its `min_samples`
  (50 requests with the defaults) since the last increase.

Gates in `warn` or `dry_run` mode count too (their decisions say whether there is
evidence; only their WARN and FAIL do not hold the weight). Pure: the caller gives the
decisions and what was measured since the last increase (`SinceIncrease`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from canaryd.store import RevisionWindow
from gates import GateDecision, GateState
from gates.config import GatesConfig
from gates.cycle import GATES, distinct, section
from gates.evidence import Evidence

__all__ = ["INCREASE_GATES", "SinceIncrease", "hold_reason", "needed", "since_increase"]

# The gates that must each have evidence from the revision before its traffic grows.
INCREASE_GATES = ("error", "latency", "quality")


@dataclass(frozen=True, slots=True)
class SinceIncrease:
    """What the revision measured after `since` (its last confirmed traffic increase, or
    its evidence start): distinct pairs, and the speculative arm's production requests
    in whole telemetry intervals (0 without telemetry)."""

    since: datetime
    pairs: int
    requests: int = 0


def since_increase(evidence: Evidence, window: RevisionWindow, at: datetime) -> SinceIncrease:
    """What the revision measured after its last confirmed traffic increase (or its
    evidence start) up to `at`, of `evidence` (its window's): distinct pairs, and the
    speculative arm's production requests in whole telemetry intervals."""
    mark = window.evidence_start
    if window.increased_at is not None and window.increased_at > mark:
        mark = window.increased_at
    pairs = sum(1 for record in distinct(evidence.records) if record.started_at > mark)
    telemetry = evidence.telemetry
    requests = (
        0
        if telemetry is None
        else sum(
            interval.requests or 0
            for interval in telemetry.speculative.intervals
            if interval.start >= mark and interval.end <= at
        )
    )
    return SinceIncrease(mark, pairs, requests)


def needed(share: float, min_samples: int) -> int:
    """The new samples a weight step needs of a gate: `share` of its `min_samples`, at
    least one."""
    return max(1, math.ceil(share * min_samples))


def _covering(gate: str, decisions: Sequence[GateDecision]) -> GateDecision | None:
    """The enforced telemetry gate among `decisions` that covers pair gate `gate`."""
    names = {spec.name for spec in GATES if gate in spec.covers}
    return next((d for d in decisions if d.name in names and d.enforced), None)


def _evidence(
    gate: str,
    decisions: Sequence[GateDecision],
    covered: Collection[str],
    since: SinceIncrease,
    config: GatesConfig,
    share: float,
) -> str | None:
    """Why `gate` has no evidence from the revision since the last increase (None: it
    has)."""
    covering = _covering(gate, decisions) if gate in covered else None
    judging = covering or next((d for d in decisions if d.name == gate), None)
    if judging is None:
        return f"{gate} did not judge"
    if judging.state is GateState.NODATA:
        return f"{judging.name} NODATA"
    need = needed(share, section(config, judging.name).min_samples)
    if covering is not None:
        if since.requests < need:
            return f"{judging.name}: {since.requests} of {need} requests"
        return None
    if since.pairs < need:
        return f"{gate}: {since.pairs} of {need} pairs"
    return None


def hold_reason(
    verdict: str,
    fresh: bool,
    decisions: Sequence[GateDecision],
    covered: Collection[str],
    since: SinceIncrease,
    config: GatesConfig,
    share: float,
) -> str | None:
    """Why the revision's traffic must not grow now, in one line (None: it may).
    `verdict`, `fresh`, `decisions` and `covered` are the revision's verdict; `config`
    the gates config it was judged with; `share` `rollout.increase_evidence_share`."""
    if verdict == "FAIL":
        return "the revision FAILed"
    if not fresh:
        return "the verdict is not fresh (superseded, or no gate run since the window opened)"
    against = [
        f"{d.name} {d.state.value}"
        for d in decisions
        if d.enforced
        and (d.state is GateState.FAIL or (d.state is GateState.WARN and d.name not in covered))
    ]
    if against:
        return f"an enforce gate is not clear: {', '.join(against)}"
    missing = [
        why
        for gate in INCREASE_GATES
        if (why := _evidence(gate, decisions, covered, since, config, share)) is not None
    ]
    if missing:
        return (
            "no evidence from the revision since "
            f"{since.since.isoformat(timespec='seconds')} for {'; '.join(missing)}"
        )
    return None
