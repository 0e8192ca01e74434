"""The two halves of every statistical check — the CUSUM that may FAIL and the bound that
may PASS — and what they mean for gross faults and for the evidence a gate reads."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from gates import GateState, error_gate, quality_gate
from gates.config import ErrorGateConfig, GateConfigBase, LivenessGateConfig, QualityGateConfig
from gates.core import GateDecision
from gates.pairs.liveness import liveness_gate
from gates.pairs.testing import at, record, result, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.detectors import sequential_state
from gates.stats.sequential import LlrCusum
from gates.window import select

H = 10.0


def cusum(statistic: float, peak: float | None = None) -> LlrCusum:
    return LlrCusum(statistic, statistic if peak is None else peak, None, None, 1)


def first_fail(
    records: list[PairRecord],
    gate: Callable[..., GateDecision],
    config: GateConfigBase,
    start: int = 1,
) -> tuple[int, GateDecision]:
    """The number of pairs after which `gate` first FAILs at the default config's share of
    the budget, re-evaluating pair by pair from pair `start` on."""
    decision = None
    for n in range(start, len(records) + 1):
        decision = gate(records[:n], config, now=at(n), arl0=DEFAULT_ARL0)
        if decision.state is GateState.FAIL:
            return n, decision
    raise AssertionError(f"no FAIL in {len(records)} pairs: {decision}")


class TestSequentialState:
    def test_alarm_fails_without_a_minimum_sample(self) -> None:
        """S ≥ h is a FAIL even with three pairs and min_samples 100."""
        assert sequential_state(cusum(H), H, 3, 100, passed=False, warned=False) is GateState.FAIL

    def test_alarm_overrides_a_passing_bound(self) -> None:
        """The detector's FAIL wins over a bound on the right side of the tolerance."""
        state = sequential_state(cusum(H + 1), H, 500, 100, passed=True, warned=False)
        assert state is GateState.FAIL

    @pytest.mark.parametrize(
        ("statistic", "peak"), [(H / 2, H / 2), (0.0, H), (H - 0.01, H - 0.01)]
    )
    def test_half_threshold_or_a_past_alarm_warns(self, statistic: float, peak: float) -> None:
        """S past h/2, or a peak that reached h earlier in the window, is a WARN, even with
        a passing bound and too few pairs."""
        assert (
            sequential_state(cusum(statistic, peak), H, 3, 100, passed=True, warned=False)
            is GateState.WARN
        )

    def test_quiet_detector_below_min_samples_is_nodata(self) -> None:
        """Below min_samples a quiet detector is NODATA, never PASS."""
        state = sequential_state(cusum(1.0), H, 99, 100, passed=True, warned=False)
        assert state is GateState.NODATA

    @pytest.mark.parametrize(
        ("passed", "warned", "expected"),
        [
            (True, False, GateState.PASS),
            (True, True, GateState.PASS),
            (False, True, GateState.WARN),
            (False, False, GateState.INCONCLUSIVE),
        ],
    )
    def test_with_enough_pairs_the_bound_decides(
        self, passed: bool, warned: bool, expected: GateState
    ) -> None:
        """With min_samples and a quiet detector: PASS on the bound, WARN on the estimate,
        otherwise INCONCLUSIVE."""
        assert sequential_state(cusum(1.0), H, 100, 100, passed, warned) is expected


class TestSelectSince:
    def test_since_excludes_pairs_at_or_before_it(self) -> None:
        """Only pairs that started after `since` are evidence; the window starts after it."""
        records = [record(i) for i in range(20)]
        window = select(records, ErrorGateConfig(), at(20), since=at(9))
        assert [r.pair_id for r in window.records] == [f"p{i}" for i in range(10, 20)]
        assert window.start == at(10)
        assert window.end == at(19)

    def test_nothing_after_since_is_an_empty_window(self) -> None:
        """A `since` after the newest pair leaves nothing to judge: NODATA."""
        records = [record(i) for i in range(200)]
        assert not select(records, ErrorGateConfig(), at(300), since=at(250)).records
        decision = error_gate(
            records, ErrorGateConfig(), now=at(300), since=at(250), arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.NODATA

    def test_since_drops_a_fault_before_the_last_transition(self) -> None:
        """A dead speculative arm before `since` (say, before a restore) no longer FAILs
        the error gate; the clean pairs after it are judged alone."""
        dead = [record(i, speculative=result(ok=False)) for i in range(50)]
        clean = [record(50 + i) for i in range(400)]
        config = ErrorGateConfig()
        assert (
            error_gate([*dead, *clean], config, now=at(450), arl0=DEFAULT_ARL0).state
            is GateState.FAIL
        )
        after = error_gate([*dead, *clean], config, now=at(450), since=at(49), arl0=DEFAULT_ARL0)
        assert after.state is GateState.PASS
        assert after.window_start == at(50)


class TestGrossFaults:
    def test_greedy_mismatch_storm_fails_quality_within_twenty_pairs(self) -> None:
        """80 % greedy mismatches add about 0.8 · log 4 per pair to the mismatch CUSUM
        (0.5 % → 2 %), which crosses h = log(ARL0) ≈ 17.5 after 16 pairs: FAIL long
        before min_samples = 100 pairs."""
        records = [record(i, pair_scores=scores(exact=i % 5 == 4)) for i in range(40)]
        config = QualityGateConfig()
        n, decision = first_fail(records, quality_gate, config)
        assert n <= 20 < config.min_samples
        assert decision.detail.startswith("FAIL by quality.mismatch")
        assert decision.statistic == "greedy mismatch rate"

    def test_dead_speculative_arm_fails_the_error_gate_6_settled_pairs_in(self) -> None:
        """After 300 healthy pairs (the baseline's own failure rate bounded under the 2 %
        ceiling), every speculative request failing: each pair adds log 32 to the ceiling
        bank's gross chart (2 % → 64 %), whose threshold is h + log 3 (three charts), so it
        alarms at ⌈(17.54 + 1.10) / 3.47⌉ = 6 judged pairs — the single chart at 2 % → 4 %
        took ⌈17.54 / log 2⌉ = 26 — although min_samples is 100. A pair is judged once
        `settle_pairs` (10) later pairs exist, so the gate FAILs 16 pairs in; the liveness
        gate, which reads every pair at once, has FAILed 5 pairs in."""
        healthy = 300
        records = [record(i, speculative=result(ok=i < healthy)) for i in range(healthy + 60)]
        config = ErrorGateConfig()
        n, decision = first_fail(records, error_gate, config, start=healthy)
        h = math.log(DEFAULT_ARL0) + math.log(3)
        judged = math.ceil(h / math.log(0.64 / 0.02))
        assert judged == 6
        assert n - healthy == judged + config.settle_pairs == 16
        assert decision.detail.startswith("FAIL by error.")
        live, _ = first_fail(records, liveness_gate, LivenessGateConfig(), start=healthy)
        assert live - healthy == LivenessGateConfig().max_consecutive_failures == 5

    def test_from_an_empty_window_the_edge_is_the_baselines_bound(self) -> None:
        """A dead arm from the very first pair: the ceiling's edge is the larger of 2 % and
        the baseline's own failure rate, whose 95 % bound on a handful of clean pairs is
        wide (0 of 6: 39 %), so the error gate needs a few more pairs than after a healthy
        history; it still FAILs well under min_samples, and the liveness gate at pair 5."""
        records = [record(i, speculative=result(ok=False)) for i in range(60)]
        config = ErrorGateConfig()
        n, decision = first_fail(records, error_gate, config)
        assert 16 < n <= 30 < config.min_samples
        assert decision.detail.startswith("FAIL by error.")
        live, _ = first_fail(records, liveness_gate, LivenessGateConfig())
        assert live == LivenessGateConfig().max_consecutive_failures == 5


class TestErrorBank:
    def test_a_third_of_requests_failing_decides_in_tens_of_pairs(self) -> None:
        """30 % speculative failures after 300 healthy pairs: the bank's 16 % chart decides
        within 70 judged pairs on every one of 20 seeds — within 80 pairs, 10 of them not
        yet settled (median 38; a single 2 % → 4 % chart took a median of 83 + 10)."""
        import random

        healthy = 300
        for seed in range(20):
            rng = random.Random(seed)
            records = [
                record(i, speculative=result(ok=i < healthy or rng.random() >= 0.3))
                for i in range(healthy + 120)
            ]
            config = ErrorGateConfig()
            n, decision = first_fail(records, error_gate, config, start=healthy)
            assert n - healthy <= 70 + config.settle_pairs, (seed, n)
            assert decision.detail.startswith("FAIL by error.")
