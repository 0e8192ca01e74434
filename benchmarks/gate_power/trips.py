"""Counting trips of the switch on a simulated stream: `TripCounter` feeds the stream's
pairs, a chunk at a time, through the product's judging path (`gates.cycle`: the latest
window, the pins the daemon would take, every pair gate) and switch policy (`gates.step`),
and counts a trip on a rollback, an enforce FAIL or CUSUM peak at h (`alarms`), or the
liveness rule; a human then restores and the evidence restarts. Also the decision
readings the counters and the fault runs share, and the 95 % Poisson bound on a count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scipy.stats import chi2

from gates import (
    DetectorReading,
    Evaluation,
    GateDecision,
    GatesConfig,
    GateState,
    ReferenceStats,
    SwitchMode,
    SwitchState,
    step,
)
from gates.core import checks
from gates.cycle import evaluate_all, latest_window, pins
from gates.records import PairRecord
from gates.stats.budget import SECONDS_PER_30_DAYS


def detector_readings(decisions: Sequence[GateDecision]) -> list[tuple[str, DetectorReading]]:
    """Every enforce check's sequential detector, as its decision carries it."""
    return [
        (check.name, check.detector)
        for check in checks(d for d in decisions if d.enforced)
        if check.detector is not None
    ]


def alarms(decisions: Sequence[GateDecision], margin: float = 1.0) -> list[str]:
    """The enforce checks that FAILed or whose CUSUM peak reached `margin` × h."""
    failed = [d.name for d in decisions if d.enforced and d.state is GateState.FAIL]
    peaked = [name for name, r in detector_readings(decisions) if r.peak >= margin * r.threshold]
    return sorted(set(failed) | set(peaked))


def pins_settled(
    references: dict[str, ReferenceStats], categories: int, config: GatesConfig
) -> bool:
    """Every category pinned, every pin at its target: nothing left to pin or grow."""
    target = config.drift.pin_target_samples
    return len(references) >= categories and all(r.n >= target for r in references.values())


def poisson_upper95(count: int) -> float:
    return float(chi2.ppf(0.95, 2 * count + 2) / 2.0)


class TripCounter:
    """The healthy section's trip rules under one configuration, fed the shared pair
    stream one chunk at a time: all gates every `every` pairs, a trip on a FAIL, a
    rollback or an enforce CUSUM peak at h, or on the liveness rule (evaluated by the
    caller, at this configuration's budget); after a trip a human restores and the
    evidence restarts."""

    def __init__(self, config: GatesConfig, *, every: int, live: int, peaks: bool = True) -> None:
        self.config = config
        self.peaks = peaks  # False: the daemon's own rule, a trip only when the switch moves
        self.every = every
        self.live = live
        self.references: dict[str, ReferenceStats] = {}
        self.state = SwitchState()
        self.history: list[Evaluation] = []
        self.trips: list[dict[str, Any]] = []
        self.evaluations = 0
        self.failed_evaluations = 0  # evaluations with an enforce gate at FAIL
        self.live_quiet = 0

    def observe(
        self, records: Sequence[PairRecord], done: int, liveness: GateDecision, categories: int
    ) -> None:
        """Judge the stream after its first `done` pairs (`records` ends with them)."""
        now = records[-1].started_at
        if not pins_settled(self.references, categories, self.config):
            window = latest_window(records, self.config)
            self.references.update(pins(window, self.references, self.state, self.config, now))
        tripped_by: list[str] = []
        if liveness.enforced and liveness.state is GateState.FAIL and done > self.live_quiet:
            tripped_by = [liveness.name]
        if done % self.every == 0:
            decisions = evaluate_all(
                latest_window(records, self.config),
                self.config,
                now=now,
                references=self.references,
                since=self.state.since,
            )
            self.evaluations += 1
            self.history.append(Evaluation(now, tuple(decisions)))
            self.state = step(self.state, self.history[-20:], self.config.policy, now=now).state
            if self.peaks:
                tripped_by = sorted({*tripped_by, *alarms(decisions)})
            self.failed_evaluations += any(
                d.enforced and d.state is GateState.FAIL for d in decisions
            )
            if self.state.mode is SwitchMode.ROLLED_BACK:
                tripped_by = sorted({*tripped_by, self.state.actor})
        if tripped_by:
            self.trips.append({"pair": done, "by": tripped_by})
            # A human restores; the evidence restarts at the restore.
            self.state = SwitchState(
                generation=self.state.generation + 1, since=now, reason="restored"
            )
            self.history = []
            self.live_quiet = done + self.live  # the liveness rule has no evidence restart

    def summary(self, done: int) -> dict[str, Any]:
        budget = self.config.budget
        scale = SECONDS_PER_30_DAYS / budget.design_pair_interval_s / max(done, 1)
        return {
            "simulated_pairs": done,
            "evaluations": self.evaluations,
            "evaluations_with_a_fail": self.failed_evaluations,
            "evaluate_every_pairs": self.every,
            "trips": len(self.trips),
            "trips_per_30_days": len(self.trips) * scale,
            "trips_per_30_days_upper95": poisson_upper95(len(self.trips)) * scale,
            "budget_per_30_days": budget.false_rollbacks_per_30_days,
        }
