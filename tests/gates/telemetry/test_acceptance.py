"""The `telemetry.acceptance` gate (gates/telemetry/acceptance.py) on simulated production
traffic (gates.telemetry.testing: 5 requests per second of about 100 tokens, 4 draft
tokens per verify step, acceptance varying between requests, 15 s scrapes): a healthy arm
PASSes against the reference pinned from its first minutes and never alarms over six
hours of a drifting traffic mix; a 30 % drop of acceptance length FAILs within two
minutes; the estimate is the window's 1 + accepted ÷ drafts; missing counters or a
missing reference are NODATA and say why."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError

from gates.config import TelemetryAcceptanceGateConfig
from gates.core import GateState
from gates.stats.budget import DEFAULT_ARL0
from gates.telemetry.acceptance import (
    AcceptanceReference,
    pin_acceptance_reference,
    telemetry_acceptance_gate,
)
from gates.telemetry.intervals import (
    ArmTelemetry,
    TelemetryEvidence,
    TelemetryInterval,
)
from gates.telemetry.testing import ArmTraffic, end_of, simulate_arm

CONFIG = TelemetryAcceptanceGateConfig()
HEALTHY = ArmTraffic(draft_tokens=4, acceptance=0.7)
# Acceptance 0.42 per draft token takes the length from about 2.73 to about 1.85: a
# drop of just over 30 %.
DROPPED = replace(HEALTHY, acceptance=0.42)
PIN = 12  # intervals (3 minutes) of healthy telemetry before the pin is taken


def speculative(arm: ArmTelemetry) -> TelemetryEvidence:
    return TelemetryEvidence(ArmTelemetry(), arm)


def pinned(arm: ArmTelemetry) -> AcceptanceReference:
    reference = pin_acceptance_reference(arm, CONFIG, now=end_of(PIN - 1))
    assert reference is not None
    return reference


def length_of(intervals: tuple[TelemetryInterval, ...]) -> float:
    accepted = sum(i.accepted_tokens or 0 for i in intervals)
    return 1.0 + accepted / sum(i.drafts or 0 for i in intervals)


class TestHealthy:
    def test_passes_against_its_pin_and_estimates_the_length(self) -> None:
        """Healthy telemetry PASSes once pinned; the decision is named
        `telemetry.acceptance` and its estimate is 1 + accepted ÷ drafts over the
        window, exactly."""
        arm = simulate_arm(np.random.default_rng(0), HEALTHY, intervals=2 * PIN)
        decision = telemetry_acceptance_gate(
            speculative(arm),
            CONFIG,
            now=end_of(2 * PIN - 1),
            reference=pinned(arm),
            arl0=DEFAULT_ARL0,
        )
        assert decision.name == "telemetry.acceptance"
        assert decision.state is GateState.PASS, decision.detail
        assert decision.estimate == pytest.approx(length_of(arm.intervals), rel=1e-12)
        assert decision.threshold == pytest.approx(0.85 * pinned(arm).acceptance_length)

    def test_no_alarm_over_six_hours_of_drifting_mix(self) -> None:
        """Six hours in which the traffic mix moves acceptance ±4 % and the request
        rate swings between 1 and 9 per second: no FAIL or WARN at any hour, and the
        detector stays below a third of its threshold, for two seeds."""
        intervals = 6 * 240
        for seed in (1, 2):
            plan = [
                replace(
                    HEALTHY,
                    acceptance=0.7 + 0.03 * float(np.sin(2 * np.pi * i / 300)),
                    rps=5.0 + 4.0 * float(np.sin(2 * np.pi * i / 480)),
                )
                for i in range(intervals)
            ]
            arm = simulate_arm(np.random.default_rng(seed), plan, intervals=intervals)
            reference = pinned(arm)
            config = CONFIG.model_copy(update={"window_seconds": 6 * 3600.0})
            for hour in range(1, 7):
                decision = telemetry_acceptance_gate(
                    speculative(arm),
                    config,
                    now=end_of(hour * 240 - 1),
                    reference=reference,
                    arl0=DEFAULT_ARL0,
                )
                assert decision.state is GateState.PASS, decision.detail
                assert decision.detector is not None
                assert decision.detector.peak < decision.detector.threshold / 3


class TestDrop:
    def test_thirty_percent_drop_fails_within_two_minutes(self) -> None:
        """Acceptance length 30 % lower from interval 20 on: never FAIL before, FAIL
        within eight intervals (two minutes) after, for three seeds."""
        for seed in range(3):
            plan = [HEALTHY] * 20 + [DROPPED] * 20
            arm = simulate_arm(np.random.default_rng(seed), plan, intervals=40)
            reference = pinned(arm)
            states = [
                telemetry_acceptance_gate(
                    speculative(arm), CONFIG, now=end_of(k), reference=reference, arl0=DEFAULT_ARL0
                ).state
                for k in range(40)
            ]
            assert GateState.FAIL not in states[:20]
            assert GateState.FAIL in states[20:28], (seed, states[20:28])
            dropped = telemetry_acceptance_gate(
                speculative(arm), CONFIG, now=end_of(39), reference=reference, arl0=DEFAULT_ARL0
            )
            assert dropped.estimate is not None and dropped.threshold is not None
            assert dropped.estimate < dropped.threshold

    def test_drop_within_tolerance_does_not_fail(self) -> None:
        """An 8 % lower acceptance length (inside the 15 % tolerance) does not FAIL: it
        PASSes after an hour."""
        plan = [HEALTHY] * PIN + [replace(HEALTHY, acceptance=0.65)] * 228
        arm = simulate_arm(np.random.default_rng(9), plan, intervals=240)
        decision = telemetry_acceptance_gate(
            speculative(arm), CONFIG, now=end_of(239), reference=pinned(arm), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.PASS, decision.detail

    def test_configured_reference_is_exact(self) -> None:
        """A configured reference length needs no pin: a 30 % drop against it FAILs."""
        config = CONFIG.model_copy(update={"reference_acceptance_length": 2.73})
        arm = simulate_arm(np.random.default_rng(4), DROPPED, intervals=20)
        decision = telemetry_acceptance_gate(
            speculative(arm), config, now=end_of(19), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.FAIL
        assert "configured" in decision.detail


class TestNoData:
    def test_without_reference_is_nodata_with_the_length(self) -> None:
        """No reference yet: NODATA, saying so, with the window's length as estimate."""
        arm = simulate_arm(np.random.default_rng(5), HEALTHY, intervals=8)
        decision = telemetry_acceptance_gate(
            speculative(arm), CONFIG, now=end_of(7), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "no reference pinned yet" in decision.detail
        assert decision.estimate == pytest.approx(length_of(arm.intervals))

    def test_without_draft_counters_is_nodata(self) -> None:
        """No draft counters: NODATA; an engine that reports acceptance only as a gauge
        is named as such."""
        arm = simulate_arm(np.random.default_rng(6), HEALTHY, intervals=8)
        reference = AcceptanceReference(2.7)
        blind = ArmTelemetry.of(
            replace(i, drafts=None, accepted_tokens=None) for i in arm.intervals
        )
        decision = telemetry_acceptance_gate(
            speculative(blind), CONFIG, now=end_of(7), reference=reference, arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "no draft counters" in decision.detail
        gauge = ArmTelemetry.of(replace(i, reported_acceptance_length=2.7) for i in blind.intervals)
        decision = telemetry_acceptance_gate(
            speculative(gauge), CONFIG, now=end_of(7), reference=reference, arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "only as a gauge" in decision.detail

    def test_too_few_drafts_is_not_a_pass(self) -> None:
        """Fewer intervals than min_intervals: never PASS."""
        arm = simulate_arm(np.random.default_rng(7), HEALTHY, intervals=3)
        decision = telemetry_acceptance_gate(
            speculative(arm),
            CONFIG,
            now=end_of(2),
            reference=AcceptanceReference(2.7),
            arl0=DEFAULT_ARL0,
        )
        assert decision.state is GateState.NODATA


class TestPin:
    def test_pin_waits_for_enough_drafts(self) -> None:
        """The pin needs pin_min_drafts drafts over pin_min_intervals intervals; it is
        the first of them, with their spread between intervals."""
        arm = simulate_arm(np.random.default_rng(8), HEALTHY, intervals=PIN)
        assert pin_acceptance_reference(arm, CONFIG, now=end_of(3)) is None
        reference = pin_acceptance_reference(arm, CONFIG, now=end_of(PIN - 1))
        assert reference is not None
        assert reference.intervals >= CONFIG.pin_min_intervals
        assert reference.drafts >= CONFIG.pin_min_drafts
        used = arm.intervals[: reference.intervals]
        assert reference.acceptance_length == pytest.approx(length_of(used))
        assert reference.dispersion is not None and reference.dispersion > 0
        assert reference.acceptance_rate is not None and 0 < reference.acceptance_rate < 1

    def test_alarm_drop_must_exceed_tolerance(self) -> None:
        """An alarm drop no larger than the tolerated one is refused at start."""
        with pytest.raises(ValidationError, match="must exceed max_relative_drop"):
            TelemetryAcceptanceGateConfig(max_relative_drop=0.2, alarm_relative_drop=0.2)
