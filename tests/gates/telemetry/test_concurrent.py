"""`telemetry.acceptance` against the concurrent stable (gates/telemetry/concurrent.py), on
simulated production traffic (gates.telemetry.testing, 15 s scrapes): a traffic mix that
moves acceptance for both arms alike never alarms, where the same arm judged against a
pin from its first minutes FAILs; a canary 30 % below the stable FAILs within minutes;
blocks follow the scrapes both arms were read at; a stable that drafted nothing leaves the
gate on its reference from the past."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np

from gates.config import TelemetryAcceptanceGateConfig
from gates.core import GateState
from gates.stats.budget import DEFAULT_ARL0
from gates.telemetry.acceptance import (
    STATISTIC,
    pin_acceptance_reference,
    telemetry_acceptance_gate,
)
from gates.telemetry.concurrent import CONCURRENT_STATISTIC, aligned, judged_concurrently
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence, TelemetryInterval
from gates.telemetry.testing import T0, ArmTraffic, end_of, simulate_arm

CONFIG = TelemetryAcceptanceGateConfig()
HEALTHY = ArmTraffic(draft_tokens=4, acceptance=0.7)
HOURS_3 = 720  # 15 s intervals


def mix_shift(intervals: int) -> list[ArmTraffic]:
    """Acceptance per draft token falling 0.80 → 0.55 over `intervals`: code-heavy traffic
    turning to chat, as n-gram drafting sees it (acceptance length about 3.4 → 2.1)."""
    return [
        replace(HEALTHY, acceptance=0.80 - 0.25 * i / (intervals - 1)) for i in range(intervals)
    ]


def judged(evidence: TelemetryEvidence, index: int, **kwargs: object):  # type: ignore[no-untyped-def]
    return telemetry_acceptance_gate(
        evidence, CONFIG, now=end_of(index), arl0=DEFAULT_ARL0, **kwargs
    )


class TestMixShift:
    def test_a_mix_shift_never_alarms_against_the_concurrent_stable(self) -> None:
        """Canary and stable serve the same shifting mix for three hours: never FAIL nor
        WARN, and PASS at the end, judged against the stable."""
        rng = np.random.default_rng(3)
        plan = mix_shift(HOURS_3)
        evidence = TelemetryEvidence(
            speculative=simulate_arm(rng, plan, intervals=HOURS_3),
            stable=simulate_arm(rng, plan, intervals=HOURS_3),
        )
        states = [judged(evidence, index).state for index in range(19, HOURS_3, 20)]
        assert GateState.FAIL not in states and GateState.WARN not in states
        last = judged(evidence, HOURS_3 - 1)
        assert last.state is GateState.PASS
        assert judged_concurrently(last) and last.statistic == CONCURRENT_STATISTIC
        assert "concurrent stable" in last.detail

    def test_the_same_shift_fails_against_a_pin_from_the_past(self) -> None:
        """What the stable is for: the same canary alone, against a pin from its first
        three minutes, FAILs as the mix moves."""
        rng = np.random.default_rng(3)
        arm = simulate_arm(rng, mix_shift(HOURS_3), intervals=HOURS_3)
        reference = pin_acceptance_reference(arm, CONFIG, now=end_of(11))
        assert reference is not None
        last = judged(TelemetryEvidence(speculative=arm), HOURS_3 - 1, reference=reference)
        assert last.state is GateState.FAIL and last.statistic == STATISTIC


class TestFault:
    def test_a_canary_30pct_below_the_stable_fails_within_minutes(self) -> None:
        """Acceptance per draft token 0.42 against the stable's 0.7 (length down just over
        30 %): FAIL within 3 minutes of telemetry, naming both lengths."""
        rng = np.random.default_rng(5)
        evidence = TelemetryEvidence(
            speculative=simulate_arm(rng, replace(HEALTHY, acceptance=0.42), intervals=40),
            stable=simulate_arm(rng, HEALTHY, intervals=40),
        )
        first = next(
            index for index in range(40) if judged(evidence, index).state is GateState.FAIL
        )
        assert first < 12
        failed = judged(evidence, first)
        assert "concurrent stable's" in failed.detail and failed.n_baseline > 0

    def test_a_healthy_canary_beside_its_stable_passes(self) -> None:
        rng = np.random.default_rng(6)
        evidence = TelemetryEvidence(
            speculative=simulate_arm(rng, HEALTHY, intervals=60),
            stable=simulate_arm(rng, HEALTHY, intervals=60),
        )
        assert judged(evidence, 59).state is GateState.PASS


class TestBlocks:
    @staticmethod
    def interval(start: int, end: int, drafts: int, accepted: int) -> TelemetryInterval:
        return TelemetryInterval(
            T0 + timedelta(seconds=start),
            T0 + timedelta(seconds=end),
            drafts=drafts,
            draft_tokens=4 * drafts,
            accepted_tokens=accepted,
        )

    def test_a_missed_scrape_merges_into_the_next_block(self) -> None:
        """The stable missed the scrape at 30 s: its 15→45 s interval meets the canary's
        two intervals in one block; the canary's interval after the last common end waits."""
        canary = [
            self.interval(0, 15, 10, 15),
            self.interval(15, 30, 10, 16),
            self.interval(30, 45, 10, 17),
            self.interval(45, 60, 10, 18),
        ]
        stable = [self.interval(0, 15, 20, 30), self.interval(15, 45, 40, 60)]
        blocks = aligned(canary, stable)
        assert [(b.drafts, b.accepted, b.stable_drafts, b.stable_accepted) for b in blocks] == [
            (10, 15, 20, 30),
            (20, 33, 40, 60),
        ]
        assert blocks[1].draft_tokens == 4 * (20 + 40)

    def test_a_block_stays_open_until_both_arms_drafted(self) -> None:
        """The arms' counters moved in turns (a busy engine's in bursts): one block from
        the first scrape to the one by which both drafted; the stable's last interval,
        with no canary drafts after it, waits."""
        canary = [
            self.interval(0, 15, 0, 0),
            self.interval(15, 30, 10, 15),
            self.interval(30, 45, 0, 0),
        ]
        stable = [
            self.interval(0, 15, 10, 15),
            self.interval(15, 30, 0, 0),
            self.interval(30, 45, 20, 30),
        ]
        assert [(b.drafts, b.stable_drafts) for b in aligned(canary, stable)] == [(10, 10)]

    def test_a_stable_that_drafted_nothing_leaves_the_past_reference(self) -> None:
        """Stable scraped but idle: the gate judges against its pinned reference as before."""
        rng = np.random.default_rng(7)
        arm = simulate_arm(rng, HEALTHY, intervals=40)
        idle = ArmTelemetry.of(replace(i, drafts=0, accepted_tokens=0) for i in arm.intervals)
        reference = pin_acceptance_reference(arm, CONFIG, now=end_of(11))
        decision = judged(TelemetryEvidence(speculative=arm, stable=idle), 39, reference=reference)
        assert decision.statistic == STATISTIC and not judged_concurrently(decision)
