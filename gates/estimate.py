"""How far an undecided verdict is from a decision: `estimate`, the evidence still needed
and the minutes it takes at the current rates.

A verdict that is INCONCLUSIVE or NODATA waits on the enforce checks that a PASS needs
(every enforce gate but the pair gates an enforced telemetry gate covers) and that have
not PASSed. For each such check the remaining need is the larger of:
- its sample size: `min_samples` of its gate's section less the samples it has (the
  smaller arm's count), the same for the caller's `min_pairs`;
- its confidence bound: a check whose estimate is inside its tolerance but whose bound
  is not yet (the upper bound above a maximum, or the lower bound below a minimum)
  PASSes once the bound's half-width shrinks to the distance between the estimate and
  the limit; a half-width shrinks as 1/√n, so it needs n × (half-width ÷ distance)²
  samples in all, if the estimate holds (a rate with no events yet: its exact upper
  bound shrinks as 1/n, so n × bound ÷ limit).
Needs are counted in the check's own unit: pairs for the pair gates, production requests
for `telemetry.errors` and `telemetry.latency`, drafts (verify steps) for
`telemetry.acceptance`; each is converted to minutes at the caller's current rate of that
unit, and the largest decides. A check with no estimate inside its tolerance (a WARN,
or an estimate past the limit) has no finite need: it decides by FAILing or by the
traffic changing, so the minutes are unknown (None). Pure: the caller passes the rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gates.config import GatesConfig
from gates.core import GateDecision, GateState, checks
from gates.cycle import TELEMETRY_GATES, Judgement, section

__all__ = ["Estimate", "Unit", "estimate", "unit_of"]

Unit = Literal["pairs", "requests", "drafts"]
_UNITS: Mapping[str, Unit] = {"telemetry.acceptance": "drafts"}


@dataclass(frozen=True, slots=True)
class Estimate:
    """`pairs_to_decision`: the pairs the pair gates still need before the verdict can
    decide (0 when only telemetry is awaited); `minutes_to_decision`: how long the
    slowest need takes at the current rates. Both None when the verdict is decided (PASS
    or FAIL), and the minutes also when a need has no finite figure or its rate is
    unknown or zero. `waiting_on`: the check with the largest need in minutes (or the
    first without a finite one)."""

    pairs_to_decision: int | None
    minutes_to_decision: float | None
    waiting_on: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pairs_to_decision": self.pairs_to_decision,
            "minutes_to_decision": (
                None if self.minutes_to_decision is None else round(self.minutes_to_decision, 1)
            ),
            "waiting_on": self.waiting_on,
        }


def unit_of(name: str) -> Unit:
    """The unit a gate's (or check's) samples are counted in."""
    gate = _gate_name(name)
    if gate in _UNITS:
        return _UNITS[gate]
    return "requests" if gate in TELEMETRY_GATES else "pairs"


def estimate(
    judgement: Judgement,
    config: GatesConfig,
    *,
    pairs_per_minute: float | None,
    requests_per_minute: float | None = None,
    drafts_per_minute: float | None = None,
    min_pairs: int = 0,
) -> Estimate:
    """The evidence `judgement` still needs before its verdict can decide, and the
    minutes that takes at the current rates: `pairs_per_minute` (the pair schedule, or
    the rollout burst's rate), the speculative arm's production `requests_per_minute`
    and its `drafts_per_minute`. `config` is the configuration it was judged under (each
    gate's `min_samples`), `min_pairs` the caller's own floor. None and None when the
    verdict is PASS or FAIL."""
    if judgement.verdict in ("PASS", "FAIL"):
        return Estimate(None, None)
    rates: dict[Unit, float | None] = {
        "pairs": pairs_per_minute,
        "requests": requests_per_minute,
        "drafts": drafts_per_minute,
    }
    needs: list[tuple[str, Unit, float | None]] = []
    if judgement.pairs < min_pairs:
        needs.append(("min_pairs", "pairs", float(min_pairs - judgement.pairs)))
    for decision in judgement.decisions:
        if not decision.enforced or decision.name in judgement.covered:
            continue
        for check in checks([decision]):
            if check.state is not GateState.PASS:
                needs.append((check.name, unit_of(check.name), _need(check, config)))
    pair_needs = [need for _, unit, need in needs if unit == "pairs" and need is not None]
    pairs = math.ceil(max(pair_needs, default=0.0))
    minutes: float | None = 0.0
    waiting_on: str | None = None
    for name, unit, need in needs:
        rate = rates[unit]
        if need is None or rate is None or rate <= 0:
            if minutes is not None:
                waiting_on = name
            minutes = None
            continue
        if minutes is not None and need / rate >= minutes:
            minutes, waiting_on = need / rate, name
    if not needs:
        return Estimate(pairs, None)  # nothing enforce judges: no amount of evidence decides
    return Estimate(pairs, minutes, waiting_on)


def _gate_name(name: str) -> str:
    """The gate a check belongs to: `quality.mismatch` → `quality`, `telemetry.latency.
    e2e.p99` → `telemetry.latency`."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "telemetry" else parts[0]


def _need(check: GateDecision, config: GatesConfig) -> float | None:
    """The further samples `check` needs to PASS if its estimate holds; None when no
    amount would do (WARN, an estimate past its limit, no figures at all)."""
    if check.state is GateState.WARN:
        return None
    counts = [n for n in (check.n_baseline, check.n_speculative) if n > 0]
    have = float(min(counts, default=0))
    try:
        floor = float(section(config, _gate_name(check.name)).min_samples)
    except (AttributeError, KeyError):
        floor = 0.0
    by_size = max(floor - have, 0.0)
    if check.estimate is None or have == 0:
        return by_size if check.state is GateState.NODATA and floor > 0 else None
    growth = _bound_growth(check)
    if growth is None:
        return None
    need = max(by_size, have * (growth - 1.0))
    # Undecided with its size and bound met: held back by a rule this model does not
    # know (the error gate's outage share, quality with no content check).
    return need if need > 0 else None


def _bound_growth(check: GateDecision) -> float | None:
    """How many times its current samples `check` needs for its bound to reach its
    limit (1: it already has), from the shrinking of the bound's half-width. The limit
    is a maximum where the estimate lies below it, a minimum where above."""
    estimate, limit, lower, upper = check.estimate, check.threshold, check.lower, check.upper
    if estimate is None or limit is None:
        return 1.0
    if estimate < limit:
        if upper is None or upper <= limit:
            return 1.0
        if estimate == 0 and lower == 0:
            # A rate with no events yet: its exact upper bound shrinks as 1/n.
            return upper / limit
        return ((upper - estimate) / (limit - estimate)) ** 2
    if estimate > limit:
        if lower is None or lower >= limit:
            return 1.0
        return ((estimate - lower) / (estimate - limit)) ** 2
    return None
