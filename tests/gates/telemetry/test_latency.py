"""The `telemetry.latency` gate (gates/telemetry/latency.py) on simulated production
traffic (gates.telemetry.testing, vLLM's buckets, 5 requests per second, 15 s scrapes):
equal arms PASS within minutes and never alarm over six hours of varying load; a
speculative arm 1.5× slower under the same arrivals (so holding more requests in flight)
FAILs within ten minutes; arms at different load are left out and the decision says
so; missing histograms or load signals are NODATA, never PASS."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from gates.config import TelemetryLatencyGateConfig
from gates.core import GateDecision, GateState
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.histogram import BucketCounts
from gates.telemetry.intervals import (
    ArmTelemetry,
    TelemetryEvidence,
    TelemetryInterval,
)
from gates.telemetry.latency import (
    match_load,
    observation_weight,
    odds_alternatives,
    per_token,
    telemetry_latency_gate,
)
from gates.telemetry.testing import T0, ArmTraffic, end_of, simulate_arm

CONFIG = TelemetryLatencyGateConfig()
HEALTHY = ArmTraffic()
TEN_MINUTES = 40  # scrape intervals of 15 s


def arms(
    seed: int, baseline: ArmTraffic, speculative: ArmTraffic, intervals: int
) -> TelemetryEvidence:
    rng = np.random.default_rng(seed)
    base = simulate_arm(rng, baseline, intervals=intervals)
    spec = simulate_arm(rng, speculative, intervals=intervals)
    return TelemetryEvidence(base, spec)


def first(evidence: TelemetryEvidence, state: GateState, intervals: int) -> int | None:
    """The first interval after which the gate reads `state` (None: never)."""
    for k in range(intervals):
        if (
            telemetry_latency_gate(evidence, CONFIG, now=end_of(k), arl0=DEFAULT_ARL0).state
            is state
        ):
            return k
    return None


class TestHealthy:
    def test_equal_arms_pass_within_ten_minutes(self) -> None:
        """Equal arms at 5 requests per second PASS every check once both have
        min_samples requests, well inside ten minutes, for each of three seeds."""
        for seed in range(3):
            evidence = arms(seed, HEALTHY, HEALTHY, TEN_MINUTES)
            passed = first(evidence, GateState.PASS, TEN_MINUTES)
            assert passed is not None and passed < TEN_MINUTES, seed
            decision = telemetry_latency_gate(
                evidence, CONFIG, now=end_of(passed), arl0=DEFAULT_ARL0
            )
            assert decision.name == "telemetry.latency"
            assert {c.name for c in decision.components} == {
                f"telemetry.latency.{m}.{q}" for m in ("e2e", "ttft", "itl") for q in ("p50", "p99")
            }
            assert min(decision.n_baseline, decision.n_speculative) >= CONFIG.min_samples

    def test_no_alarm_over_six_hours_of_varying_load(self) -> None:
        """Six hours of equal arms whose load swings together (1 to 9 requests per
        second, latency rising with it, each arm's batches jittering on their own):
        no check ever FAILs or WARNs, and no detector gets past a third of its
        threshold."""
        intervals = 6 * 240
        plan = [
            replace(
                HEALTHY,
                rps=5.0 + 4.0 * float(np.sin(2 * np.pi * i / 480)),
                slowdown=1.0 + 0.2 * float(np.sin(2 * np.pi * i / 480)),
                interval_jitter=0.1,
            )
            for i in range(intervals)
        ]
        rng = np.random.default_rng(7)
        base = simulate_arm(rng, plan, intervals=intervals)
        spec = simulate_arm(rng, plan, intervals=intervals)
        config = CONFIG.model_copy(update={"window_seconds": 6 * 3600.0})
        for hour in (2, 4, 6):
            decision = telemetry_latency_gate(
                TelemetryEvidence(base, spec), config, now=end_of(hour * 240 - 1), arl0=DEFAULT_ARL0
            )
            assert decision.state is GateState.PASS, decision.detail
            for check in decision.components:
                assert check.detector is not None
                assert check.detector.peak < check.detector.threshold / 3, check.detail


class TestSlowUnderLoad:
    def test_one_and_a_half_times_slower_fails_within_ten_minutes(self) -> None:
        """A speculative arm 1.5× slower at the same arrivals holds 1.5× the requests
        in flight (Little's law); those intervals are still compared (their arrivals
        match), and the gate FAILs within ten minutes for each of three seeds."""
        slow = replace(HEALTHY, slowdown=1.5)
        for seed in range(3):
            evidence = arms(seed, HEALTHY, slow, TEN_MINUTES)
            matched = match_load(
                evidence.baseline.intervals,
                evidence.speculative.intervals,
                CONFIG.max_load_difference,
            )
            assert (matched.mismatched, len(matched.speculative)) == (0, TEN_MINUTES)
            failed = first(evidence, GateState.FAIL, TEN_MINUTES)
            assert failed is not None and failed < TEN_MINUTES, seed
            decision = telemetry_latency_gate(
                evidence, CONFIG, now=end_of(failed), arl0=DEFAULT_ARL0
            )
            assert decision.detector is None
            assert "FAIL by telemetry.latency." in decision.detail

    def test_slower_only_after_onset_fails_after_it(self) -> None:
        """Healthy for ten minutes, then 1.5× slower: never FAIL before the onset, FAIL
        within ten minutes after it."""
        plan = [HEALTHY] * TEN_MINUTES + [replace(HEALTHY, slowdown=1.5)] * TEN_MINUTES
        rng = np.random.default_rng(11)
        base = simulate_arm(rng, HEALTHY, intervals=2 * TEN_MINUTES)
        spec = simulate_arm(rng, plan, intervals=2 * TEN_MINUTES)
        failed = first(TelemetryEvidence(base, spec), GateState.FAIL, 2 * TEN_MINUTES)
        assert failed is not None and TEN_MINUTES <= failed < 2 * TEN_MINUTES

    def test_per_token_slowdown_straddling_buckets_fails(self) -> None:
        """The slowdown the power benchmark injects: a speculative arm (3 draft tokens,
        acceptance length about 2.5) whose first-token and per-token latency are 1.5× the
        baseline's at 5 requests per second. The slowed medians straddle vLLM's buckets
        (no bucket lies wholly above 1.2× the baseline's median), yet comparing the
        arms' shares above a shared bound FAILs within ten minutes for each of three
        seeds, by a median check."""
        speculative = replace(HEALTHY, draft_tokens=3, acceptance=0.7)
        length = 2.5
        slow = replace(
            speculative,
            ttft_s=1.5 * HEALTHY.ttft_s,
            itl_s=speculative.itl_s * 1.5 * length / speculative.verify_step_cost,
        )
        for seed in range(3):
            evidence = arms(20 + seed, HEALTHY, slow, TEN_MINUTES)
            failed = first(evidence, GateState.FAIL, TEN_MINUTES)
            assert failed is not None and failed < TEN_MINUTES, seed
            decision = telemetry_latency_gate(
                evidence, CONFIG, now=end_of(failed), arl0=DEFAULT_ARL0
            )
            failing = [c.name for c in decision.components if c.state is GateState.FAIL]
            assert any(name.endswith(".p50") for name in failing), failing


class TestSpeculativeSteps:
    SPECULATIVE = replace(HEALTHY, draft_tokens=4, acceptance=0.7, verify_step_cost=1.3)

    def test_healthy_speculation_passes_per_token(self) -> None:
        """A speculative arm whose verify steps take 1.3× a decode step but stream about
        2.7 tokens each PASSes: its inter-token gaps are compared per token. Read raw
        (itl_per_token off), the same gaps look 1.3× longer and the inter-token median
        does not PASS."""
        evidence = arms(13, HEALTHY, self.SPECULATIVE, TEN_MINUTES)
        decision = telemetry_latency_gate(
            evidence, CONFIG, now=end_of(TEN_MINUTES - 1), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.PASS, decision.detail
        raw = CONFIG.model_copy(update={"itl_per_token": False})
        decision = telemetry_latency_gate(
            evidence, raw, now=end_of(TEN_MINUTES - 1), arl0=DEFAULT_ARL0
        )
        median = next(c for c in decision.components if c.name.endswith("itl.p50"))
        assert median.state in (GateState.FAIL, GateState.WARN), median.detail

    def test_slower_per_token_fails(self) -> None:
        """A speculative arm whose steps are so slow under load that each token takes
        1.5× the baseline's FAILs within ten minutes."""
        slow = replace(self.SPECULATIVE, slowdown=1.5 * 2.7 / 1.3)
        failed = first(arms(14, HEALTHY, slow, TEN_MINUTES), GateState.FAIL, TEN_MINUTES)
        assert failed is not None and failed < TEN_MINUTES


class TestMatchedLoad:
    def test_mismatched_load_is_nodata_and_says_so(self) -> None:
        """A speculative arm given three times the requests per replica (so three times
        the requests in flight) is never compared: NODATA, naming the intervals left
        out for mismatched load."""
        evidence = arms(3, HEALTHY, replace(HEALTHY, rps=15.0), TEN_MINUTES)
        decision = telemetry_latency_gate(
            evidence, CONFIG, now=end_of(TEN_MINUTES - 1), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "no speculative interval at matched load" in decision.detail
        assert f"{TEN_MINUTES} at mismatched load" in decision.detail

    def test_too_few_matched_requests_is_nodata(self) -> None:
        """Only a few intervals at matched load (the rest at triple load, and the load
        read over the two minutes around each): the checks are NODATA below
        min_samples, and the detail counts what was left out."""
        plan = [HEALTHY] * 12 + [replace(HEALTHY, rps=15.0)] * 24
        rng = np.random.default_rng(5)
        base = simulate_arm(rng, HEALTHY, intervals=36)
        spec = simulate_arm(rng, plan, intervals=36)
        decision = telemetry_latency_gate(
            TelemetryEvidence(base, spec), CONFIG, now=end_of(35), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "5 speculative intervals at matched load" in decision.detail
        assert "31 at mismatched load" in decision.detail

    def test_load_is_per_replica(self) -> None:
        """A canary on one replica taking a tenth of the traffic beside a baseline on
        nine is at the same load per replica: compared, not left out."""
        base = replace(HEALTHY, rps=45.0, replicas=9)
        spec = replace(HEALTHY, rps=5.0, replicas=1)
        evidence = arms(2, base, spec, 8)
        matched = match_load(evidence.baseline.intervals, evidence.speculative.intervals, 0.5)
        assert (len(matched.speculative), matched.mismatched) == (8, 0)

    # Latency ∝ load^0.5: an arm at `ratio` times the baseline's load per replica is
    # ratio^0.5 slower for that alone.
    @staticmethod
    def at_load(ratio: float, slower: float = 1.0) -> ArmTraffic:
        return replace(HEALTHY, rps=HEALTHY.rps * ratio, slowdown=slower * ratio**0.5)

    @pytest.mark.parametrize("seed", range(3))
    def test_a_healthy_arm_at_twice_the_load_never_fails(self, seed: int) -> None:
        """A healthy speculative arm given 1.97× the baseline's requests per replica
        (so 1.40× slower, for the load alone) is left out, not compared: NODATA for
        thirty minutes, never FAIL. Matched within the old tolerance (0.5), it FAILs."""
        evidence = arms(30 + seed, HEALTHY, self.at_load(1.97), 120)
        decision = telemetry_latency_gate(evidence, CONFIG, now=end_of(119), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.NODATA, decision.detail
        assert "120 at mismatched load" in decision.detail
        loose = CONFIG.model_copy(update={"max_load_difference": 0.5})
        assert (
            telemetry_latency_gate(evidence, loose, now=end_of(119), arl0=DEFAULT_ARL0).state
            is GateState.FAIL
        )

    @pytest.mark.parametrize("seed", range(3))
    def test_a_slow_arm_at_half_the_load_never_passes(self, seed: int) -> None:
        """A speculative arm 1.4× slower than the baseline at the same load, given 0.575×
        its requests per replica (so 1.06× slower in all): left out, NODATA, never
        PASS. Matched within the old tolerance (0.5), it never FAILs."""
        evidence = arms(40 + seed, HEALTHY, self.at_load(0.575, slower=1.4), 120)
        decision = telemetry_latency_gate(evidence, CONFIG, now=end_of(119), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.NODATA, decision.detail
        loose = CONFIG.model_copy(update={"max_load_difference": 0.5})
        hidden = telemetry_latency_gate(evidence, loose, now=end_of(119), arl0=DEFAULT_ARL0).state
        assert hidden in (GateState.PASS, GateState.INCONCLUSIVE)

    def test_a_healthy_arm_at_the_edge_of_the_tolerance_never_trips(self) -> None:
        """1.2× the baseline's load per replica (1.10× slower for it): compared, never
        FAIL or WARN, no detector past a third of its threshold (vLLM's coarse TTFT
        bucket around the median keeps it from PASSing)."""
        evidence = arms(50, HEALTHY, self.at_load(1.2), 120)
        decision = telemetry_latency_gate(evidence, CONFIG, now=end_of(119), arl0=DEFAULT_ARL0)
        assert decision.state in (GateState.PASS, GateState.INCONCLUSIVE), decision.detail
        assert "at mismatched load" in decision.detail
        for check in decision.components:
            assert check.detector is not None
            assert check.detector.peak < check.detector.threshold / 3, check.detail

    def test_equal_load_matches_despite_poisson_noise_at_one_request_a_second(self) -> None:
        """At 1 request per second a 15 s interval's count varies by a quarter, more than
        the tolerance; read over two minutes, equal arms match in at least 90 % of
        intervals."""
        slow = replace(HEALTHY, rps=1.0)
        evidence = arms(6, slow, slow, 240)
        matched = match_load(
            evidence.baseline.intervals, evidence.speculative.intervals, CONFIG.max_load_difference
        )
        assert len(matched.speculative) >= 0.9 * 240, matched.note

    def test_no_load_signal_is_left_out(self) -> None:
        """Intervals with neither gauges nor request counts on an arm are left out as
        without a load signal: NODATA."""
        evidence = arms(4, HEALTHY, HEALTHY, 8)
        bare = ArmTelemetry.of(
            replace(i, running=None, waiting=None, requests=None)
            for i in evidence.speculative.intervals
        )
        decision = telemetry_latency_gate(
            TelemetryEvidence(evidence.baseline, bare), CONFIG, now=end_of(7), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA
        assert "8 with no load signal" in decision.detail


class TestMissingSignals:
    def test_no_histograms_is_nodata(self) -> None:
        """A speculative arm without latency histograms: every check NODATA, never PASS."""
        evidence = arms(6, HEALTHY, HEALTHY, TEN_MINUTES)
        blind = ArmTelemetry.of(
            replace(i, e2e=None, ttft=None, itl=None) for i in evidence.speculative.intervals
        )
        decision = telemetry_latency_gate(
            TelemetryEvidence(evidence.baseline, blind),
            CONFIG,
            now=end_of(TEN_MINUTES - 1),
            arl0=DEFAULT_ARL0,
        )
        assert decision.state is GateState.NODATA
        assert all("histogram at matched load" in c.detail for c in decision.components)

    def test_inter_token_latency_without_finished_requests_is_nodata(self) -> None:
        """Intervals whose tokens belong to requests that finished later (no request
        counted in them, no end-to-end histogram) weigh nothing: the inter-token checks
        are NODATA, not a division by zero."""
        evidence = arms(12, HEALTHY, HEALTHY, 8)
        unfinished = ArmTelemetry.of(
            replace(i, requests=0, e2e=None) for i in evidence.speculative.intervals
        )
        config = CONFIG.model_copy(update={"metrics": ("itl",)})
        decision = telemetry_latency_gate(
            TelemetryEvidence(evidence.baseline, unfinished),
            config,
            now=end_of(7),
            arl0=DEFAULT_ARL0,
        )
        assert decision.state is GateState.NODATA
        assert all(c.threshold in (0.5, pytest.approx(0.01)) for c in decision.components)

    def test_empty_window_is_nodata(self) -> None:
        """No intervals at all: NODATA."""
        empty = TelemetryEvidence(ArmTelemetry(), ArmTelemetry())
        assert (
            telemetry_latency_gate(empty, CONFIG, now=T0, arl0=DEFAULT_ARL0).state
            is GateState.NODATA
        )

    def test_quantile_beyond_the_buckets_is_inconclusive(self) -> None:
        """A baseline whose P99 lies in the +inf bucket has no reading: INCONCLUSIVE,
        and the detail says why."""
        start = T0
        buckets = BucketCounts((1.0, float("inf")), (90.0, 100.0))
        interval = TelemetryInterval(
            start, start + timedelta(seconds=15), requests=100, errors=0, e2e=buckets,
            running=5.0, waiting=0.0,
        )  # fmt: skip
        evidence = TelemetryEvidence(ArmTelemetry((interval,)), ArmTelemetry((interval,)))
        config = CONFIG.model_copy(update={"metrics": ("e2e",), "quantiles": (0.99,)})
        decision = telemetry_latency_gate(evidence, config, now=end_of(0), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.INCONCLUSIVE
        assert "+inf bucket" in decision.detail


class TestPieces:
    def test_inter_token_observations_weigh_as_requests(self) -> None:
        """An inter-token observation weighs requests ÷ observations; end-to-end and
        first-token ones weigh one each; inter-token latency without a request count
        cannot be weighed."""
        itl = BucketCounts((0.02, float("inf")), (300.0, 400.0))
        interval = TelemetryInterval(T0, T0 + timedelta(seconds=15), requests=4, itl=itl)
        assert per_token(itl, 2.0).bounds == (0.01, float("inf"))
        assert observation_weight(interval, "itl", itl) == pytest.approx(0.01)
        assert observation_weight(interval, "e2e", itl) == 1.0
        unknown = replace(interval, requests=None)
        assert observation_weight(unknown, "itl", itl) is None

    def test_alternatives_multiply_the_odds(self) -> None:
        """The bank's alternatives: the odds of exceeding × 2, × 8 and × 32."""
        alternatives = odds_alternatives(0.5, 2.0)
        assert alternatives == pytest.approx([2 / 3, 8 / 9, 32 / 33])
        assert odds_alternatives(0.01, 2.0)[0] == pytest.approx(0.02 / 1.01)

    def test_decision_is_replayable_evidence(self) -> None:
        """The decision carries its window and serialises (audit rows, --json)."""
        evidence = arms(8, HEALTHY, HEALTHY, 12)
        decision: GateDecision = telemetry_latency_gate(
            evidence, CONFIG, now=end_of(11), arl0=DEFAULT_ARL0
        )
        data = decision.to_dict()
        assert data["name"] == "telemetry.latency"
        assert data["window_start"] == T0.isoformat()
        assert data["window_end"] == end_of(11).isoformat()
