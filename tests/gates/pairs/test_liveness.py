"""The liveness gate's run rule: a dead speculative arm FAILs beside a baseline that fails
most of its requests, and the run it needs is sized by liveness's own share of the
false-alarm budget, so equal arms on flaky infrastructure never FAIL it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gates import GatesConfig, GateState
from gates.config import LivenessGateConfig
from gates.pairs.liveness import liveness_gate, liveness_threshold, needed_run
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, detector_arl0
from gates.stats.sequential import lorden_threshold


def pairs(baseline_failed: np.ndarray, speculative_failed: np.ndarray) -> list[PairRecord]:
    return [
        record(i, baseline=result(ok=not b), speculative=result(ok=not s))
        for i, (b, s) in enumerate(zip(baseline_failed, speculative_failed, strict=True))
    ]


class TestDeadArmBesideAFailingBaseline:
    @pytest.mark.parametrize(("baseline_rate", "within"), [(0.5, 150), (0.6, 200), (0.7, 300)])
    def test_fails_and_never_passes(self, baseline_rate: float, within: int) -> None:
        """100 calm pairs, then the speculative arm dead and the baseline failing on
        `baseline_rate` of its requests: pairs where the baseline failed are skipped, so
        the run of speculative failures where it succeeded grows until it is improbable
        for equal arms at that rate (k · log(1/q) ≥ h: 30 at 50 %, 40 at 60 %, 57 at 70 %)
        and the gate FAILs within `within` pairs; once the run is 2 long it never PASSes
        (before: a baseline failure ended the run and the rate rule, an excess of 0.5 over
        the baseline's rate, could not hold past 50 %: PASS in 34–96 % of evaluations,
        never a FAIL)."""
        rng = np.random.default_rng(int(baseline_rate * 10))
        fault = 600
        baseline = np.concatenate([np.zeros(100, bool), rng.random(fault) < baseline_rate])
        speculative = np.concatenate([np.zeros(100, bool), np.ones(fault, bool)])
        records = pairs(baseline, speculative)
        config = LivenessGateConfig()
        states = []
        for n in range(101, len(records) + 1):
            decision = liveness_gate(records[:n], config, now=at(n), arl0=DEFAULT_ARL0)
            states.append(decision.state)
            if decision.state is GateState.FAIL:
                break
        assert states[-1] is GateState.FAIL, decision.detail
        assert len(states) <= within
        warned = states.index(GateState.WARN)
        assert GateState.PASS not in states[warned:]


class TestBudgetShare:
    def test_the_run_needed_follows_the_budget(self) -> None:
        """Liveness spends its own share of the false-alarm budget, 1/16 of a detector's:
        beside a baseline failing 30 % the run needed is 17 at the default budget (0.3^17 ≤
        e^-20.25) and 12 with 1,000 times the budget (h lower by log 1,000)."""
        base = {i for i in range(0, 30, 2)}  # 15 failures in 50 pairs, before the run
        records = [
            record(i, baseline=result(ok=i not in base), speculative=result(ok=i < 33))
            for i in range(50)
        ]
        config = LivenessGateConfig()
        default = liveness_gate(records, config, now=at(50), arl0=detector_arl0(GatesConfig()))
        assert (default.state, default.threshold) == (GateState.FAIL, 17.0)
        generous = GatesConfig.model_validate({"budget": {"false_rollbacks_per_30_days": 100.0}})
        looser = liveness_gate(records, config, now=at(50), arl0=detector_arl0(generous))
        assert looser.threshold == 12.0
        assert needed_run(5, 0.3, liveness_threshold(detector_arl0(generous))) == 12
        assert liveness_threshold(DEFAULT_ARL0) == pytest.approx(
            lorden_threshold(DEFAULT_ARL0) + math.log(16)
        )

    @pytest.mark.parametrize(("rate", "run"), [(0.10, 9), (0.30, 17)])
    def test_equal_arms_on_flaky_infrastructure_never_fail(self, rate: float, run: int) -> None:
        """Both arms failing independently on `rate` of 20,000 pairs, evaluated every 6:
        never a FAIL (a run of `run` needed, rate^run ≤ e^-h per pair where the baseline
        succeeded: within liveness's share of the budget)."""
        rng = np.random.default_rng(int(rate * 100))
        records = pairs(rng.random(20_000) < rate, rng.random(20_000) < rate)
        config = LivenessGateConfig()
        assert needed_run(5, rate, liveness_threshold(detector_arl0(GatesConfig()))) == run
        window = config.window_pairs or 500
        for n in range(window, len(records) + 1, 6):
            decision = liveness_gate(records[n - window : n], config, now=at(n), arl0=DEFAULT_ARL0)
            assert decision.state is not GateState.FAIL, (n, decision.detail)
