"""Evidence with the fault-injecting fake engine: the gates and the switch policy run over
real pair-runner output on the shipped prompts, as the daemon runs them.

Healthy soaks never trip; each injected fault trips the switch through the gate meant to
catch it, within a bounded number of pairs (the figures are in docs/gates.md).
"""

from __future__ import annotations

import pytest

from gates import GatesConfig, GateState, SwitchMode, SwitchPolicyConfig
from gates.records import PairRecord
from tests.support.soak import (  # the autouse fixture quiets the runner's per-pair logs
    SPECULATIVE,
    _quiet_pair_logs,  # noqa: F401
    healthy_records,
    soak,
)

PREFIX = 1000  # healthy pairs before a fault: the first 900 pin the drift references


@pytest.fixture(scope="module")
def healthy_seed0() -> list[PairRecord]:
    return healthy_records(0, 2000)


class TestHealthySoak:
    @pytest.mark.slow
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_two_thousand_healthy_pairs_never_trip(
        self, seed: int, healthy_seed0: list[PairRecord]
    ) -> None:
        """2,000 healthy pairs, evaluated every 50 pairs: no transition, and once the
        windows are full every enforce gate PASSes."""
        records = healthy_seed0 if seed == 0 else healthy_records(seed, 2000)
        result = soak(records, seed=seed, every=50)
        assert result.transitions == ()
        assert result.state.mode is SwitchMode.AUTO
        assert all(d.state is GateState.PASS for d in result.history[-1].decisions)


FAULTS = {
    # acceptance length in one category −30 %: per-token acceptance 0.7 → 0.5 with k = 4
    "drift": (SPECULATIVE.model_copy(update={"acceptance_rate_by_category": {"code": 0.5}}), 600),
    "latency": (SPECULATIVE.model_copy(update={"latency_factor": 1.5}), 400),
    "quality": (SPECULATIVE.model_copy(update={"corrupt_rate": 0.03}), 900),
    # measured: the error gate trips 675 pairs into the fault (seed 0, paired detector);
    # the budget leaves about 1.5 × that
    "error": (SPECULATIVE.model_copy(update={"error_rate": 0.05}), 1000),
}


class TestInjectedFaults:
    @pytest.mark.parametrize("gate", list(FAULTS))
    def test_fault_trips_through_its_gate(self, gate: str, healthy_seed0: list[PairRecord]) -> None:
        """After 1,000 healthy pairs the fault begins; the switch rolls back, tripped by the
        gate meant to catch that fault, within the pair budget."""
        fault, budget = FAULTS[gate]
        result = soak(
            healthy_seed0[:PREFIX],
            seed=0,
            fault=fault,
            fault_pairs=budget,
            evaluate_from=PREFIX - 100,
        )
        assert result.state.mode is SwitchMode.ROLLED_BACK, f"{gate} did not trip"
        assert result.transitions[0].actor == f"gate:{gate}"
        assert result.pairs_to_trip is not None and result.pairs_to_trip <= budget
        if gate == "drift":
            tripping = result.transitions[0].evidence[0]
            assert tripping.categories == ("code",)
            assert "code" in result.transitions[0].reason

    def test_nodata_never_passes_and_never_restores(self, healthy_seed0: list[PairRecord]) -> None:
        """A speculative error storm trips the switch; then the canary stalls (no pairs),
        and with auto-restore on, hours of NODATA evaluations neither PASS nor restore."""
        config = GatesConfig(policy=SwitchPolicyConfig(auto_restore=True, cooldown_seconds=60))
        storm = SPECULATIVE.model_copy(update={"error_rate": 1.0})
        result = soak(
            healthy_seed0[:PREFIX], seed=0, fault=storm, fault_pairs=50,
            config=config, evaluate_from=PREFIX - 25, stop_at_trip=True,
        )  # fmt: skip
        assert result.state.mode is SwitchMode.ROLLED_BACK
        assert result.transitions[0].actor == "gate:liveness"  # critical: trips at once
        from datetime import timedelta

        from gates import Evaluation, evaluate_all, step

        state, history = result.state, list(result.history)
        last = history[-1].at
        for hour in range(7, 13):  # past every gate's 6 h window: the canary has stalled
            now = last + timedelta(hours=hour)
            decisions = evaluate_all([], config, now=now, references=result.references)
            assert all(d.state is GateState.NODATA for d in decisions)
            history.append(Evaluation(now, tuple(decisions)))
            state = step(state, history, config.policy, now=now).state
        assert state.mode is SwitchMode.ROLLED_BACK
