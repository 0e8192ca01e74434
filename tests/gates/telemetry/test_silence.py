"""When a telemetry decision's evidence has stopped (gates/telemetry/silence.py): an arm
with no interval, or no request, for the bound (`max_silence_s`, or
`max_silence_intervals` of its scrape interval where longer) makes each telemetry gate
NODATA, naming the arm and why; until then the decision stands."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np

from gates.config import TelemetryAcceptanceGateConfig, TelemetryLatencyGateConfig
from gates.core import GateState
from gates.stats.budget import DEFAULT_ARL0
from gates.telemetry.acceptance import AcceptanceReference, telemetry_acceptance_gate
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence, TelemetryInterval
from gates.telemetry.latency import telemetry_latency_gate
from gates.telemetry.silence import SILENCE, silence, silent
from gates.telemetry.testing import T0, ArmTraffic, end_of, simulate_arm

LATENCY = TelemetryLatencyGateConfig()
ACCEPTANCE = TelemetryAcceptanceGateConfig()
HEALTHY = ArmTraffic()
SPECULATIVE = ArmTraffic(draft_tokens=4, acceptance=0.7)


def interval(index: int, requests: int | None = 75, seconds: float = 15.0) -> TelemetryInterval:
    start = T0 + timedelta(seconds=index * seconds)
    return TelemetryInterval(start, start + timedelta(seconds=seconds), requests=requests)


class TestSilence:
    def test_flowing_evidence_is_not_silent(self) -> None:
        """Intervals up to now, each with requests: no reason."""
        arm = [interval(i) for i in range(40)]
        assert silence({"speculative": arm}, end_of(39), LATENCY) is None

    def test_no_interval_for_five_minutes_is_silent(self) -> None:
        """At 15 s scrapes the bound is 5 minutes (10 intervals are less): 4.75 minutes
        after the newest interval the evidence still flows, at 5 it has stopped."""
        arm = [interval(i) for i in range(40)]
        assert silence({"speculative": arm}, end_of(39 + 19), LATENCY) is None
        reason = silence({"speculative": arm}, end_of(39 + 20), LATENCY)
        assert reason is not None and silent(reason)
        assert reason.startswith(f"{SILENCE}: no interval from the speculative arm")
        assert "5 min ago" in reason and "the bound: 5 min" in reason

    def test_intervals_without_requests_are_silent(self) -> None:
        """Scrapes keep succeeding but count no request: silent once the newest interval
        with one is 5 minutes old."""
        arm = [interval(i, 75 if i < 20 else 0) for i in range(40)]
        reason = silence({"baseline": arm}, end_of(39), LATENCY)
        assert reason is not None and "no request served by the baseline arm" in reason

    def test_the_bound_follows_the_scrape_interval(self) -> None:
        """At 60 s scrapes 10 intervals (10 minutes) are longer than 5 minutes: the
        bound. 9 minutes without an interval is not yet silence."""
        arm = [interval(i, seconds=60.0) for i in range(20)]
        newest = arm[-1].end
        assert silence({"speculative": arm}, newest + timedelta(minutes=9), LATENCY) is None
        reason = silence({"speculative": arm}, newest + timedelta(minutes=10), LATENCY)
        assert reason is not None and "the bound: 10 min" in reason

    def test_an_arm_without_intervals_says_nothing(self) -> None:
        """No interval at all is the gate's NODATA for want of evidence, not silence."""
        assert silence({"speculative": []}, end_of(0), LATENCY) is None

    def test_an_arm_that_never_served_is_silent_once_the_bound_passes(self) -> None:
        """Intervals without a request from the first: silent only once they span the
        bound."""
        arm = [interval(i, 0) for i in range(40)]
        assert silence({"speculative": arm[:10]}, end_of(9), LATENCY) is None
        reason = silence({"speculative": arm}, end_of(39), LATENCY)
        assert reason is not None and "no request served by the speculative arm" in reason

    def test_latency_and_counts_show_service_without_a_request_count(self) -> None:
        """Without a request counter an interval served when it has drafts or latency
        observations."""
        assert not TelemetryInterval(T0, end_of(0)).served
        assert TelemetryInterval(T0, end_of(0), drafts=3).served
        assert not TelemetryInterval(T0, end_of(0), requests=0, drafts=3).served


class TestGates:
    def test_latency_gate_passes_then_is_nodata_when_the_canary_goes_dark(self) -> None:
        """Equal arms PASS `telemetry.latency` after ten minutes; the speculative arm's
        scrapes then stop, and five minutes later the gate is NODATA naming it."""
        rng = np.random.default_rng(1)
        base = simulate_arm(rng, HEALTHY, intervals=60)
        spec = simulate_arm(rng, HEALTHY, intervals=40)
        evidence = TelemetryEvidence(base, spec)
        assert (
            telemetry_latency_gate(evidence, LATENCY, now=end_of(39), arl0=DEFAULT_ARL0).state
            is GateState.PASS
        )
        assert (
            telemetry_latency_gate(evidence, LATENCY, now=end_of(58), arl0=DEFAULT_ARL0).state
            is GateState.PASS
        )
        dark = telemetry_latency_gate(evidence, LATENCY, now=end_of(59), arl0=DEFAULT_ARL0)
        assert dark.state is GateState.NODATA
        assert dark.detail.startswith(f"{SILENCE}: no interval from the speculative arm")

    def test_acceptance_gate_is_nodata_when_the_canary_serves_nothing(self) -> None:
        """A healthy arm PASSes `telemetry.acceptance`; after five minutes of intervals
        with no request (and so no draft) it is NODATA."""
        rng = np.random.default_rng(2)
        arm = simulate_arm(rng, SPECULATIVE, intervals=40)
        reference = AcceptanceReference(2.73)
        idle = simulate_arm(rng, replace(SPECULATIVE, rps=0.0), intervals=40, start=end_of(39))
        evidence = TelemetryEvidence(ArmTelemetry(), arm)
        judged = telemetry_acceptance_gate(
            evidence, ACCEPTANCE, now=end_of(39), reference=reference, arl0=DEFAULT_ARL0
        )
        assert judged.state is GateState.PASS, judged.detail
        gone = TelemetryEvidence(ArmTelemetry(), ArmTelemetry.of([*arm.intervals, *idle.intervals]))
        dark = telemetry_acceptance_gate(
            gone, ACCEPTANCE, now=end_of(79), reference=reference, arl0=DEFAULT_ARL0
        )
        assert dark.state is GateState.NODATA
        assert "no request served by the speculative arm" in dark.detail
        assert dark.estimate == judged.estimate  # the window's length, still reported
