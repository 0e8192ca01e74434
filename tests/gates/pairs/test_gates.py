"""Each gate on hand-built windows: every state is reachable, NODATA below the minimum."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import numpy as np
import pytest
from pydantic import ValidationError

from gates import (
    GateDecision,
    GateMode,
    GatesConfig,
    GateState,
    ReferenceStats,
    drift_gate,
    error_gate,
    evaluate_all,
    latency_gate,
    liveness_gate,
    pin_reference,
    quality_gate,
    speedup_gate,
)
from gates.config import (
    DriftGateConfig,
    ErrorGateConfig,
    LatencyGateConfig,
    LatencySLO,
    LivenessGateConfig,
    QualityGateConfig,
    SpeedupGateConfig,
)
from gates.pairs.testing import at, record, result, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET


def latency_records(n: int, factor: float) -> list[PairRecord]:
    """Speculative e2e = factor × baseline e2e, baseline 1..2 s."""
    out = []
    for i in range(n):
        base = 1.0 + (i % 100) / 100
        out.append(
            record(
                i,
                baseline=result(base, ttft=0.1, tpot=0.02),
                speculative=result(base * factor, ttft=0.1, tpot=0.02),
            )
        )
    return out


FAST_LATENCY = LatencyGateConfig(metrics=("e2e",), min_samples=50, bootstrap_resamples=200)


class TestConfig:
    def test_unknown_key_is_rejected(self) -> None:
        """A misspelt knob fails validation instead of being ignored."""
        with pytest.raises(ValidationError):
            GatesConfig.model_validate({"latency": {"max_ration": 1.5}})

    def test_the_gaussian_median_alternative_is_gone_with_a_reason(self) -> None:
        """`latency.shift_alarm_factor` (the Gaussian median chart's alternative) fails
        with what replaced it, not as a misspelt key."""
        with pytest.raises(ValidationError, match="sign test now: remove the key"):
            GatesConfig.model_validate({"latency": {"shift_alarm_factor": 1.25}})

    def test_window_needs_a_limit(self) -> None:
        """A gate with neither window_pairs nor window_seconds is rejected."""
        with pytest.raises(ValidationError, match="window"):
            ErrorGateConfig(window_pairs=None, window_seconds=None)

    def test_k_of_m_must_fit(self) -> None:
        """trip_k larger than trip_m can never trip and is rejected."""
        with pytest.raises(ValidationError, match="trip_k"):
            GatesConfig.model_validate({"policy": {"trip_k": 6, "trip_m": 5}})


class TestLatencyGate:
    def test_faster_speculative_passes(self) -> None:
        """A speculative arm at half the baseline latency PASSes with the ratio as evidence:
        per metric the median paired ratio first, then each quantile's ratio."""
        decision = latency_gate(
            latency_records(200, 0.5),
            FAST_LATENCY,
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.PASS
        assert decision.estimate == pytest.approx(0.5)
        assert decision.n_baseline == decision.n_speculative == 200
        assert [c.name for c in decision.components] == ["latency.e2e.median", "latency.e2e.p99"]
        assert all(c.state is GateState.PASS for c in decision.components)
        assert all(c.estimate == pytest.approx(0.5) for c in decision.components)

    def test_clearly_slower_fails(self) -> None:
        """A ratio of 1.5 with tight bounds is above 1.2: FAIL."""
        decision = latency_gate(
            latency_records(200, 1.5),
            FAST_LATENCY,
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.FAIL
        assert decision.lower is not None and decision.lower > 1.2

    def test_straddling_interval_warns_or_is_inconclusive(self) -> None:
        """60 pairs of independent lognormal arms: the P99 interval is wide and straddles
        1.2 — its component WARNs with the estimate at 1.3 and is INCONCLUSIVE at 1.1. The
        median paired ratio's interval straddles 1.2 too (at 1.1: 1.229 in [1.015, 1.273],
        31 of 60 pairs above 1.2) with its CUSUM far under h, so it WARNs at both, and so
        does the gate — never PASS or FAIL."""
        rng = np.random.default_rng(2)
        base, spec = rng.lognormal(0, 0.4, 60), rng.lognormal(0, 0.4, 60)
        spec = spec / (np.quantile(spec, 0.99) / np.quantile(base, 0.99))  # ratio exactly 1

        def gate(ratio: float) -> tuple[GateState, dict[str, GateState]]:
            records = [
                record(i, baseline=result(float(b)), speculative=result(float(s) * ratio))
                for i, (b, s) in enumerate(zip(base, spec, strict=True))
            ]
            config = FAST_LATENCY.model_copy(update={"bootstrap_resamples": 200})
            decision = latency_gate(
                records, config, now=at(60), arl0=DEFAULT_ARL0, budget_30d=DEFAULT_DETECTOR_BUDGET
            )
            return decision.state, {c.name: c.state for c in decision.components}

        high, high_components = gate(1.3)
        assert high_components == {
            "latency.e2e.median": GateState.WARN,
            "latency.e2e.p99": GateState.WARN,
        }
        assert high is GateState.WARN
        low, low_components = gate(1.1)
        assert low_components == {
            "latency.e2e.median": GateState.WARN,
            "latency.e2e.p99": GateState.INCONCLUSIVE,
        }
        assert low is GateState.WARN

    @staticmethod
    def _tail_records(n: int, seed: int, tail: float, tail_factor: float) -> list[PairRecord]:
        """Paired lognormal e2e (σ 0.3, shared prompt effect) with the speculative arm at
        exactly `max_ratio` × the baseline in distribution, plus stalls ×`tail_factor` on
        a share `tail` of speculative requests only."""
        rng = np.random.default_rng(seed)
        prompt = rng.lognormal(0.0, 0.3, n)
        base = prompt * rng.lognormal(0.0, 0.3, n)
        spec = 1.2 * prompt * rng.lognormal(0.0, 0.3, n)
        spec = np.where(rng.random(n) < tail, spec * tail_factor, spec)
        return [
            record(i, baseline=result(float(b)), speculative=result(float(s)))
            for i, (b, s) in enumerate(zip(base, spec, strict=True))
        ]

    def test_tail_detector_holds_at_the_tolerance_edge(self) -> None:
        """A speculative arm exactly `max_ratio` slower at every quantile is within the
        tolerance: over 4 × 5,000 pairs the paired tail detector never reaches h, and its
        discordant pairs split about evenly (the level moves with the window, the
        calibration does not rest on an estimate of either arm's P99)."""
        for seed in range(4):
            records = self._tail_records(5000, seed, tail=0.0, tail_factor=1.0)
            decision = latency_gate(
                records,
                FAST_LATENCY,
                now=at(5000),
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            )
            tail = next(c for c in decision.components if c.name == "latency.e2e.p99")
            assert tail.state is not GateState.FAIL, tail.detail
            assert "pairs where one side exceeds" in tail.detail

    def test_tail_detector_fails_on_a_tail_only_fault(self) -> None:
        """Stalls ×4 on 3 % of speculative requests leave the median ratio at 1.2 but put
        the speculative P99 far past 1.2 × the baseline's: the tail detector FAILs."""
        records = self._tail_records(3000, 7, tail=0.03, tail_factor=4.0)
        decision = latency_gate(
            records,
            FAST_LATENCY,
            now=at(3000),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        states = {c.name: c.state for c in decision.components}
        assert states["latency.e2e.p99"] is GateState.FAIL
        assert states["latency.e2e.median"] is not GateState.FAIL
        assert decision.state is GateState.FAIL

    def test_below_min_samples_is_nodata(self) -> None:
        """Too few complete pairs: NODATA, never PASS."""
        decision = latency_gate(
            latency_records(49, 0.5),
            FAST_LATENCY,
            now=at(49),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.NODATA

    def test_failed_pairs_are_not_latency_samples(self) -> None:
        """Pairs with a failed arm are left to the error gate."""
        records = [*latency_records(49, 0.5), record(49, speculative=result(ok=False))]
        assert (
            latency_gate(
                records,
                FAST_LATENCY,
                now=at(50),
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            ).state
            is GateState.NODATA
        )

    def test_absolute_slo_fails_on_slow_speculative(self) -> None:
        """An e2e P90 SLO of 0.5 s fails when every speculative e2e is at least 0.75 s."""
        config = FAST_LATENCY.model_copy(
            update={"slos": (LatencySLO(metric="e2e", quantile=0.9, max_seconds=0.5),)}
        )
        decision = latency_gate(
            latency_records(200, 0.75),
            config,
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.FAIL
        assert decision.components[-1].name == "latency.e2e.p90.slo"

    def test_unreported_metric_is_left_out(self) -> None:
        """An engine that reports no TTFT does not hold the gate at NODATA."""
        records = [
            record(i, baseline=result(1.0, ttft=None), speculative=result(0.5, ttft=None))
            for i in range(100)
        ]
        config = LatencyGateConfig(min_samples=50, bootstrap_resamples=200)
        decision = latency_gate(
            records, config, now=at(100), arl0=DEFAULT_ARL0, budget_30d=DEFAULT_DETECTOR_BUDGET
        )
        assert decision.state is GateState.PASS
        assert "ttft not reported" in decision.detail

    def test_window_keeps_only_recent_pairs(self) -> None:
        """Pairs older than window_seconds are not evidence: 60 old slow pairs are ignored."""
        config = FAST_LATENCY.model_copy(update={"window_seconds": 1000.0})
        old = latency_records(60, 3.0)
        fresh = [record(1000 + i, baseline=result(1.0), speculative=result(0.5)) for i in range(60)]
        decision = latency_gate(
            [*old, *fresh],
            config,
            now=at(1060),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.PASS
        assert decision.window_start == at(1000)


class TestErrorGate:
    def make(
        self, n: int, spec_fail: set[int], base_fail: frozenset[int] | set[int] = frozenset()
    ) -> list[PairRecord]:
        return [
            record(
                i, baseline=result(ok=i not in base_fail), speculative=result(ok=i not in spec_fail)
            )
            for i in range(n)
        ]

    def test_clean_window_passes(self) -> None:
        """No errors in 300 pairs: the upper bound is under the 2 % ceiling — PASS."""
        assert (
            error_gate(
                self.make(300, set()), ErrorGateConfig(), now=at(300), arl0=DEFAULT_ARL0
            ).state
            is GateState.PASS
        )

    def test_sustained_speculative_only_errors_warn_then_fail(self) -> None:
        """A speculative-only failure on every 30th pair (3.3 %, tolerance: the baseline's
        rate + 1 %) is a slow fault for the paired CUSUM (p0 = edge of tolerance, p1 = 2 ×
        p0): at 300 pairs it is far under h = log(ARL0) ≈ 17.3, so the gate WARNs on the
        estimate; the same rate sustained for 3,000 pairs alarms it — FAIL."""
        early = error_gate(
            self.make(300, set(range(0, 300, 30))),
            ErrorGateConfig(),
            now=at(300),
            arl0=DEFAULT_ARL0,
        )
        assert early.state is GateState.WARN
        paired = early.components[0]
        assert paired.name == "error.paired"
        assert paired.estimate == pytest.approx(10 / 290)  # the newest 10 not yet settled
        late = error_gate(
            self.make(3000, set(range(0, 3000, 30))),
            ErrorGateConfig(),
            now=at(3000),
            arl0=DEFAULT_ARL0,
        )
        assert late.state is GateState.FAIL
        assert late.components[0].state is GateState.FAIL
        assert late.detail.startswith("FAIL by error.")

    def test_shared_errors_do_not_count_against_speculative(self) -> None:
        """Errors on both arms of the same pairs are concordant: the paired check passes."""
        both = set(range(0, 300, 100))
        decision = error_gate(
            self.make(300, both, both), ErrorGateConfig(), now=at(300), arl0=DEFAULT_ARL0
        )
        assert decision.components[0].state is GateState.PASS

    def test_ceiling_alone_can_fail(self) -> None:
        """The speculative arm failing on every 10th pair, each failure followed by the
        baseline failing on the next pair (a shared node the speculative arm takes down),
        and the baseline failing on its own every 100th: no excess over the baseline (each
        arm fails alone about equally often: the paired check does not FAIL), but the
        speculative arm's own failures — where the baseline had succeeded on the pair and
        the 3 before: 59 of 330 — against the baseline's own rate — where the speculative
        arm had: 6 of 354, a 95 % bound of 3.3 % — alarm the ceiling CUSUM: FAIL by the
        ceiling check."""
        spec = {i for i in range(600) if i % 10 == 5}
        base = {i + 1 for i in spec} | {i for i in range(600) if i % 100 == 0}
        decision = error_gate(
            self.make(600, spec, base), ErrorGateConfig(), now=at(600), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.FAIL
        assert decision.statistic == "speculative error rate where the baseline succeeded"
        paired, ceiling = decision.components
        assert paired.state is not GateState.FAIL
        assert ceiling.state is GateState.FAIL
        assert ceiling.estimate == pytest.approx(59 / 330)
        assert ceiling.threshold == pytest.approx(0.0332, abs=0.0005)

    def test_shared_outage_never_fails_and_is_left_out(self) -> None:
        """Both arms failing on the same 3 % of 3,000 pairs (an upstream outage) never
        FAILs, evaluated every 100 pairs; the ceiling is the speculative rate over pairs
        with a healthy baseline only: of the 2,990 settled pairs, those where both failed
        and those in a cluster of baseline failures are left out, the rest judged."""
        rng = np.random.default_rng(3)
        shared = {int(i) for i in rng.choice(3000, size=90, replace=False)}
        records = self.make(3000, shared, shared)
        config = ErrorGateConfig(outage_spans=())
        states = {
            error_gate(records[:n], config, now=at(n), arl0=DEFAULT_ARL0).state
            for n in range(100, 3001, 100)
        }
        assert GateState.FAIL not in states
        final = error_gate(records, config, now=at(3000), arl0=DEFAULT_ARL0)
        ceiling = final.components[1]
        assert ceiling.name == "error.ceiling"
        both = sum(1 for i in shared if i < 2990)
        lead = config.lead_pairs  # the baseline also succeeded on the 3 pairs before
        clean = [i for i in range(2990) if not any(i - k in shared for k in range(lead + 1))]
        assert ceiling.n_baseline == len(clean) < 2990 - both
        assert ceiling.estimate == 0.0
        assert f"left out: {both} pairs where both arms failed, 0 in shared outages" in (
            final.detail
        )
        assert final.state is GateState.PASS
        screened = error_gate(records, ErrorGateConfig(), now=at(3000), arl0=DEFAULT_ARL0)
        assert screened.state is GateState.PASS
        assert screened.components[1].n_baseline < ceiling.n_baseline

    def test_equal_independent_error_rates_do_not_fail(self) -> None:
        """Both arms failing independently on 2 % of 3,000 pairs (no excess, speculative at
        the ceiling) never FAILs, evaluated every 100 pairs."""
        rng = np.random.default_rng(4)
        spec = {i for i in range(3000) if rng.random() < 0.02}
        base = {i for i in range(3000) if rng.random() < 0.02}
        records = self.make(3000, spec, base)
        config = ErrorGateConfig()
        for n in range(100, 3001, 100):
            decision = error_gate(records[:n], config, now=at(n), arl0=DEFAULT_ARL0)
            assert decision.state is not GateState.FAIL, decision.detail

    def test_small_excess_warns_and_few_pairs_are_inconclusive(self) -> None:
        """2 speculative-only failures in 100 settled pairs: an excess of 2 % is over the 1 %
        tolerance (its 80 % upper bound 3.4 %), but the CUSUM is far from h — WARN. A clean
        window too short to bound the excess under its tolerance is INCONCLUSIVE: at 60
        settled pairs (min_samples 50) the excess bound is 1.4 % > 1 % (the ceiling, 0 of
        60 against the baseline's own 0 of 60, whose 95 % bound 4.9 % is its edge,
        PASSes)."""
        warn = error_gate(
            self.make(110, {3, 50}), ErrorGateConfig(), now=at(110), arl0=DEFAULT_ARL0
        )
        assert warn.state is GateState.WARN
        config = ErrorGateConfig(min_samples=50)
        short = error_gate(self.make(70, set()), config, now=at(70), arl0=DEFAULT_ARL0)
        assert short.state is GateState.INCONCLUSIVE
        assert [c.state for c in short.components] == [GateState.INCONCLUSIVE, GateState.PASS]
        assert short.components[1].threshold == pytest.approx(0.0487, abs=0.001)

    def test_excess_within_tolerance_never_fails(self) -> None:
        """Speculative-only failures on 0.25 % of pairs with a clean baseline are within
        max_excess_rate (1 %): never a FAIL, however long the window."""
        records = self.make(5000, set(range(100, 5000, 400)))
        for n in range(1000, 5001, 1000):
            decision = error_gate(records[:n], ErrorGateConfig(), now=at(n), arl0=DEFAULT_ARL0)
            assert decision.state is not GateState.FAIL, decision.detail

    def test_below_min_samples_is_nodata(self) -> None:
        """99 settled pairs with min_samples 100: NODATA."""
        assert (
            error_gate(
                self.make(109, set()), ErrorGateConfig(), now=at(109), arl0=DEFAULT_ARL0
            ).state
            is GateState.NODATA
        )


class TestQualityGate:
    def test_identical_outputs_pass(self) -> None:
        """500 identical greedy pairs: every check's bound is within tolerance — PASS. At
        300 the mismatch bound (0 of 300: 0.535 %) is not yet under the 0.5 % tolerance,
        which takes 322 pairs at 80 % confidence — INCONCLUSIVE, never PASS early."""
        records = [record(i) for i in range(500)]
        assert (
            quality_gate(records, QualityGateConfig(), now=at(500), arl0=DEFAULT_ARL0).state
            is GateState.PASS
        )
        early = quality_gate(records[:300], QualityGateConfig(), now=at(300), arl0=DEFAULT_ARL0)
        assert early.state is GateState.INCONCLUSIVE
        assert early.detail.startswith("INCONCLUSIVE by quality.mismatch")

    def test_mismatches_above_tolerance_fail(self) -> None:
        """5 % greedy mismatches (tolerance 0.5 %) add about 0.065 per pair to the bank's
        0.5 % → 8 % chart (a hit +2.77, a miss −0.078): about 13 after 200 pairs, under
        the bank's h ≈ 18.6 — WARN; by 300 pairs it has alarmed — FAIL."""
        records = [record(i, pair_scores=scores(exact=i % 20 != 0)) for i in range(300)]
        early = quality_gate(records[:200], QualityGateConfig(), now=at(200), arl0=DEFAULT_ARL0)
        assert early.state is GateState.WARN
        decision = quality_gate(records, QualityGateConfig(), now=at(300), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.FAIL
        assert decision.statistic == "greedy mismatch rate"

    def test_numeric_ties_are_not_mismatches(self) -> None:
        """20 % of greedy pairs diverge, each at a token the baseline model scores within
        the tie margin of its own choice (bf16 numerics): counted as ties, never a FAIL,
        however long the run; the same divergences with a large margin FAIL."""
        tie = [
            record(i, pair_scores=scores(exact=i % 5 != 0, margin=None if i % 5 else 0.03))
            for i in range(3000)
        ]
        for n in range(500, 3001, 500):
            decision = quality_gate(tie[:n], QualityGateConfig(), now=at(n), arl0=DEFAULT_ARL0)
            assert decision.state is not GateState.FAIL, decision.detail
        mismatch = next(c for c in decision.components if c.name == "quality.mismatch")
        assert "numeric ties 600/3000" in mismatch.detail
        real = [
            record(i, pair_scores=scores(exact=i % 5 != 0, margin=None if i % 5 else 2.5))
            for i in range(200)
        ]
        assert (
            quality_gate(real, QualityGateConfig(), now=at(200), arl0=DEFAULT_ARL0).state
            is GateState.FAIL
        )

    def test_unjudged_divergences_count(self) -> None:
        """A divergence no teacher could score (a server without prompt log-probs) is
        counted as a mismatch: no tie is assumed without evidence."""
        records = [record(i, pair_scores=scores(exact=i % 5 != 0)) for i in range(200)]
        assert (
            quality_gate(records, QualityGateConfig(), now=at(200), arl0=DEFAULT_ARL0).state
            is GateState.FAIL
        )

    def test_mismatch_is_not_judged_when_sampling(self) -> None:
        """At temperature 0.7 outputs may differ: the mismatch check is left out."""
        records = [record(i, pair_scores=scores(exact=False), temperature=0.7) for i in range(300)]
        decision = quality_gate(records, QualityGateConfig(), now=at(300), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.PASS
        assert all(c.name != "quality.mismatch" for c in decision.components)

    def test_score_inferiority_fails(self) -> None:
        """A mean task-score delta of −0.1 is below the −0.02 margin: FAIL."""
        records = [
            record(i, pair_scores=scores(delta=-0.1 if i % 2 else -0.1 + 0.01), temperature=0.7)
            for i in range(200)
        ]
        decision = quality_gate(records, QualityGateConfig(), now=at(200), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.FAIL
        assert decision.components[0].estimate == pytest.approx(-0.095)

    def test_speculative_only_loops_fail(self) -> None:
        """Speculative loops on 5 % of pairs, half of them shared with the baseline: the
        shared ones do not count, so the speculative-only rate is 2.5 % (tolerance 1 %).
        After 400 pairs the loop CUSUM (edge: baseline-only rate + 1 %, alarm: twice
        that) is far under h — WARN on the estimate; sustained for 4,000 pairs it alarms."""
        records = [
            record(i, pair_scores=scores(spec_loop=i % 20 == 0, base_loop=i % 40 == 0))
            for i in range(4000)
        ]

        def loops(n: int) -> GateDecision:
            decision = quality_gate(records[:n], QualityGateConfig(), now=at(n), arl0=DEFAULT_ARL0)
            return next(c for c in decision.components if c.name == "quality.loops")

        early = loops(400)
        assert early.estimate == pytest.approx(10 / 400)
        assert early.state is GateState.WARN
        assert loops(4000).state is GateState.FAIL

    def test_loops_within_tolerance_never_fail(self) -> None:
        """Speculative-only loops on 0.5 % of pairs are within max_loop_rate (1 %): the loop
        check never FAILs, however long the window."""
        records = [record(i, pair_scores=scores(spec_loop=i % 200 == 100)) for i in range(5000)]
        for n in range(1000, 5001, 1000):
            decision = quality_gate(records[:n], QualityGateConfig(), now=at(n), arl0=DEFAULT_ARL0)
            loops = next(c for c in decision.components if c.name == "quality.loops")
            assert loops.state is not GateState.FAIL, loops.detail

    def test_negligible_score_loss_never_fails(self) -> None:
        """1 % of pairs scoring 0.01 lower (mean delta −0.0001, margin −0.02) is far inside
        the non-inferiority margin: the score check never FAILs."""
        deltas = [-0.01 if i % 100 == 50 else 0.0 for i in range(5000)]
        records = [record(i, pair_scores=scores(delta=d)) for i, d in enumerate(deltas)]
        for n in range(1000, 5001, 1000):
            decision = quality_gate(records[:n], QualityGateConfig(), now=at(n), arl0=DEFAULT_ARL0)
            score = next(c for c in decision.components if c.name == "quality.score")
            assert score.state is not GateState.FAIL, score.detail

    def test_below_min_samples_is_nodata(self) -> None:
        """Fewer scored pairs than min_samples: NODATA."""
        records = [record(i) for i in range(99)]
        assert (
            quality_gate(records, QualityGateConfig(), now=at(99), arl0=DEFAULT_ARL0).state
            is GateState.NODATA
        )


class TestSpeedupGate:
    def make(self, speedups: list[float]) -> list[PairRecord]:
        return [
            record(i, baseline=result(s), speculative=result(1.0)) for i, s in enumerate(speedups)
        ]

    def test_faster_passes_with_order_statistic_bounds(self) -> None:
        """Speedups 1.5..2.5: median 2.0, bounds from order statistics, PASS."""
        values = [1.5 + i / 100 for i in range(101)]
        decision = speedup_gate(
            self.make(values), SpeedupGateConfig(), now=at(101), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.PASS
        assert decision.estimate == pytest.approx(2.0)
        assert decision.lower is not None and decision.lower < 2.0 < (decision.upper or 0)

    def test_slower_fails(self) -> None:
        """Speedups 0.5..0.9: even the upper bound is below 1.0 — FAIL."""
        values = [0.5 + 0.4 * i / 100 for i in range(101)]
        assert (
            speedup_gate(
                self.make(values), SpeedupGateConfig(), now=at(101), arl0=DEFAULT_ARL0
            ).state
            is GateState.FAIL
        )

    def test_around_one_is_warn_or_inconclusive(self) -> None:
        """Median just below 1 with a straddling interval is WARN; just above, INCONCLUSIVE."""
        below = [0.8 + 0.39 * i / 100 for i in range(101)]
        above = [0.82 + 0.39 * i / 100 for i in range(101)]
        assert (
            speedup_gate(
                self.make(below), SpeedupGateConfig(), now=at(101), arl0=DEFAULT_ARL0
            ).state
            is GateState.WARN
        )
        assert (
            speedup_gate(
                self.make(above), SpeedupGateConfig(), now=at(101), arl0=DEFAULT_ARL0
            ).state
            is GateState.INCONCLUSIVE
        )

    def test_below_min_samples_is_nodata(self) -> None:
        """49 pairs with min_samples 50: NODATA."""
        assert (
            speedup_gate(
                self.make([2.0] * 49), SpeedupGateConfig(), now=at(49), arl0=DEFAULT_ARL0
            ).state
            is GateState.NODATA
        )


class TestLivenessGate:
    def test_dead_speculative_arm_fails(self) -> None:
        """Five speculative-only failures in a row: FAIL, and the gate is critical."""
        records = [record(i) for i in range(10)]
        records += [record(10 + i, speculative=result(ok=False)) for i in range(5)]
        decision = liveness_gate(records, LivenessGateConfig(), now=at(15), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.FAIL
        assert decision.critical

    def test_a_baseline_failure_is_skipped_and_raises_the_run_needed(self) -> None:
        """A pair where the baseline failed says nothing about the speculative arm: it
        neither counts nor ends the run, but the baseline's failure rate sets the run
        needed. 4 speculative failures, a pair where both failed, 2 more: a run of 6, and
        the baseline failed 1 of the run's 7 pairs (14 %: 11 needed) — WARN; 3 more make 9
        of 10 pairs (10 %: 9 needed) — FAIL."""
        records = [record(i) for i in range(10)]
        records += [record(10 + i, speculative=result(ok=False)) for i in range(4)]
        records.append(record(14, baseline=result(ok=False), speculative=result(ok=False)))
        records += [record(15 + i, speculative=result(ok=False)) for i in range(2)]
        decision = liveness_gate(records, LivenessGateConfig(), now=at(17), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.WARN
        assert (decision.estimate, decision.threshold) == (6.0, 11.0)
        records += [record(17 + i, speculative=result(ok=False)) for i in range(3)]
        decision = liveness_gate(records, LivenessGateConfig(), now=at(20), arl0=DEFAULT_ARL0)
        assert decision.state is GateState.FAIL
        assert (decision.estimate, decision.threshold) == (9.0, 9.0)

    def test_an_outage_is_no_dead_arm(self) -> None:
        """50 pairs in an outage: the baseline fails on 20 (40 %), the speculative arm on 16
        of the other 30 (53 %) — about what independent failures inside an outage do, with
        successes among them: no FAIL. A dead speculative arm in the same outage (30 of
        30: a run of 30 where 23 are needed at 40 %) FAILs."""
        base = {i for i in range(50) if i % 5 in (0, 2)}
        ok_pairs = [i for i in range(50) if i not in base]
        spec_fail = set(ok_pairs[1::2][:16]) | {ok_pairs[0]}
        records = [
            record(i, baseline=result(ok=i not in base), speculative=result(ok=i not in spec_fail))
            for i in range(50)
        ]
        decision = liveness_gate(records, LivenessGateConfig(), now=at(50), arl0=DEFAULT_ARL0)
        assert decision.state is not GateState.FAIL, decision.detail
        assert "16/30 pairs with a healthy baseline" in decision.detail
        dead = [
            record(i, baseline=result(ok=i not in base), speculative=result(ok=False))
            for i in range(50)
        ]
        assert (
            liveness_gate(dead, LivenessGateConfig(), now=at(50), arl0=DEFAULT_ARL0).state
            is GateState.FAIL
        )

    def test_a_failing_baseline_needs_a_longer_run(self) -> None:
        """The baseline failing on 15 of the last 50 pairs (30 %): equal arms make runs of 5
        speculative failures where the baseline succeeded by chance (0.3^5 ≈ 2e-3), so the
        run needed is the smallest k with 0.3^k ≤ e^-h, h = 20.25 (liveness's share of the
        budget, 1/16 of a detector's): 17. 9 WARN, 17 FAIL."""
        base = set(range(0, 30, 2))  # 15 failures, all before the run
        for run, state in ((9, GateState.WARN), (17, GateState.FAIL)):
            records = [
                record(i, baseline=result(ok=i not in base), speculative=result(ok=i < 50 - run))
                for i in range(50)
            ]
            decision = liveness_gate(records, LivenessGateConfig(), now=at(50), arl0=DEFAULT_ARL0)
            assert decision.state is state, decision.detail
            assert decision.threshold == 17

    def test_short_streak_warns_and_healthy_passes(self) -> None:
        """Two trailing failures: WARN; none: PASS."""
        records = [record(i) for i in range(10)]
        assert (
            liveness_gate(records, LivenessGateConfig(), now=at(10), arl0=DEFAULT_ARL0).state
            is GateState.PASS
        )
        records += [record(10 + i, speculative=result(ok=False)) for i in range(2)]
        assert (
            liveness_gate(records, LivenessGateConfig(), now=at(12), arl0=DEFAULT_ARL0).state
            is GateState.WARN
        )

    def test_both_arms_failing_is_inconclusive(self) -> None:
        """When the baseline fails too, nothing is learnt about the speculative arm."""
        records = [
            record(i, baseline=result(ok=False), speculative=result(ok=False)) for i in range(10)
        ]
        assert (
            liveness_gate(records, LivenessGateConfig(), now=at(10), arl0=DEFAULT_ARL0).state
            is GateState.INCONCLUSIVE
        )

    def test_stale_or_empty_window_is_nodata(self) -> None:
        """No pair within the configured window_seconds: NODATA, never PASS."""
        records = [record(i) for i in range(10)]
        config = LivenessGateConfig()
        assert config.window_seconds is not None
        later = at(9) + timedelta(seconds=config.window_seconds + 1)
        assert (
            liveness_gate(records, config, now=later, arl0=DEFAULT_ARL0).state is GateState.NODATA
        )
        assert (
            liveness_gate([], LivenessGateConfig(), now=at(0), arl0=DEFAULT_ARL0).state
            is GateState.NODATA
        )


def acceptance_records(category: str, lengths: list[float], start: int = 0) -> list[PairRecord]:
    return [
        record(
            start + i,
            category=category,
            speculative=result(0.5, output_tokens=round(40 * v), verify_steps=40),
        )
        for i, v in enumerate(lengths)
    ]


class TestDriftGate:
    REFERENCE: ClassVar[dict[str, ReferenceStats]] = {
        "code": ReferenceStats(mean=2.75, sd=0.3),
        "qa": ReferenceStats(2.75, 0.3),
    }

    def test_pin_reference_is_mean_and_sd_per_category(self) -> None:
        """Pinning averages acceptance lengths per category; thin categories are left out."""
        records = acceptance_records("code", [2.5, 3.0] * 50) + acceptance_records(
            "qa", [2.0] * 5, 100
        )
        pinned = pin_reference(records)
        assert set(pinned) == {"code"}
        assert pinned["code"].mean == pytest.approx(2.75)
        assert pinned["code"].sd == pytest.approx(0.25 * (100 / 99) ** 0.5)
        assert pinned["code"].n == 100

    def test_steady_categories_pass(self) -> None:
        """Values around the reference: PASS."""
        records = acceptance_records("code", [2.5, 3.0] * 20) + acceptance_records(
            "qa", [2.75] * 40, 40
        )
        decision = drift_gate(
            records,
            DriftGateConfig(),
            now=at(80),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.PASS
        assert decision.categories == ()

    def test_large_drop_in_one_category_fails_naming_it(self) -> None:
        """code drops 30 % for its whole window: CUSUM alarm and drop ≥ 15 % — FAIL naming code."""
        records = acceptance_records("code", [1.925] * 30) + acceptance_records(
            "qa", [2.75] * 30, 30
        )
        decision = drift_gate(
            records,
            DriftGateConfig(),
            now=at(60),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.FAIL
        assert decision.categories == ("code",)
        assert decision.estimate == pytest.approx(0.3, abs=0.01)

    def test_small_sustained_drop_only_warns(self) -> None:
        """A 10 % drop trips the CUSUM but not the 15 % relative threshold: WARN."""
        records = acceptance_records("code", [2.475] * 40)
        decision = drift_gate(
            records,
            DriftGateConfig(),
            now=at(40),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.WARN
        assert decision.categories == ("code",)

    def test_no_reference_or_thin_category_is_nodata(self) -> None:
        """Without a reference, or with too few pairs per category, there is nothing to judge."""
        records = acceptance_records("code", [2.75] * 40)
        assert (
            drift_gate(
                records,
                DriftGateConfig(),
                now=at(40),
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            ).state
            is GateState.NODATA
        )
        thin = acceptance_records("code", [2.75] * 19)
        assert (
            drift_gate(
                thin,
                DriftGateConfig(),
                now=at(19),
                references=self.REFERENCE,
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            ).state
            is GateState.NODATA
        )

    def test_unreferenced_category_keeps_gate_inconclusive(self) -> None:
        """A category with pairs but no reference is unmonitored: next to a passing one it
        makes the gate INCONCLUSIVE (never a silent PASS) and is named in the detail."""
        records = acceptance_records("code", [2.5, 3.0] * 20) + acceptance_records(
            "chat", [2.75] * 40, 40
        )
        decision = drift_gate(
            records,
            DriftGateConfig(),
            now=at(80),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.INCONCLUSIVE
        assert "unmonitored categories (no reference yet): chat" in decision.detail
        states = {c.name: c.state for c in decision.components}
        assert states == {"drift.code": GateState.PASS, "drift.chat": GateState.NODATA}

    def test_since_excludes_older_pairs(self) -> None:
        """Ten pairs of a 30 % drop before `since`, then 40 steady ones: over the whole
        window the CUSUM peaked past h (about 28 vs 17.3) before falling back — WARN; with
        `since` at the last dropped pair only the steady pairs count — PASS."""
        records = acceptance_records("code", [1.925] * 10) + acceptance_records(
            "code", [2.75] * 40, 10
        )
        config = DriftGateConfig()
        whole = drift_gate(
            records,
            config,
            now=at(50),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert whole.state is GateState.WARN
        after = drift_gate(
            records,
            config,
            now=at(50),
            references=self.REFERENCE,
            since=at(9),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert after.state is GateState.PASS
        assert after.window_start == at(10)
        assert after.components[0].n_speculative == 40

    def test_configured_reference_overrides_pinned(self) -> None:
        """A configured reference of 2.0 makes a steady 2.0 window PASS despite a pinned 2.75."""
        config = DriftGateConfig.model_validate({"references": {"code": {"mean": 2.0, "sd": 0.3}}})
        records = acceptance_records("code", [2.0] * 30)
        decision = drift_gate(
            records,
            config,
            now=at(30),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.PASS


class TestEvaluateAll:
    def test_every_gate_once_in_fixed_order_with_modes(self) -> None:
        """evaluate_all returns one decision per gate, carrying each gate's configured mode."""
        config = GatesConfig.model_validate({"speedup": {"mode": "dry_run"}})
        decisions = evaluate_all([record(i) for i in range(10)], config, now=at(10))
        assert [d.name for d in decisions] == [
            "liveness", "error", "latency", "quality", "speedup", "drift",
        ]  # fmt: skip
        assert decisions[4].mode is GateMode.DRY_RUN
        assert decisions[0].state is GateState.PASS
        assert all(d.state is GateState.NODATA for d in decisions[1:])

    def test_decision_serialises_to_json_types(self) -> None:
        """to_dict gives plain JSON types, components included."""
        import json

        decision = latency_gate(
            latency_records(100, 0.5),
            FAST_LATENCY,
            now=at(100),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        payload = json.loads(json.dumps(decision.to_dict()))
        assert payload["state"] == "PASS"
        names = [c["name"] for c in payload["components"]]
        assert names == ["latency.e2e.median", "latency.e2e.p99"]
