"""The parity gate on hand-built probes: PASS, a regression in warn and in enforce mode
(and what the switch policy does with each), a stale or missing probe, a regression from
before the switch last moved, and a capability the baseline lacks too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from gates import (
    Evaluation,
    GateMode,
    GatesConfig,
    GateState,
    SwitchMode,
    SwitchState,
    Transition,
    step,
)
from gates.config import ParityGateConfig, SwitchPolicyConfig
from gates.parity import CapabilityParity, ProbeEvidence, max_probe_age, parity_gate

NOW = datetime(2025, 6, 1, 12, tzinfo=UTC)
HEALTHY = ("stop", "logprobs", "n_gt_1", "seed_reproducible", "burst_16")


def probe(
    *,
    finished: datetime = NOW - timedelta(minutes=5),
    speculative: dict[str, str] | None = None,
    baseline: dict[str, str] | None = None,
) -> ProbeEvidence:
    """A probe where every capability passes on both arms but those given otherwise."""
    speculative, baseline = speculative or {}, baseline or {}
    return ProbeEvidence(
        run_id="probe-1",
        arm="speculative",
        started_at=finished - timedelta(minutes=3),
        finished_at=finished,
        capabilities=tuple(
            CapabilityParity(
                name,
                baseline.get(name, "pass"),
                speculative.get(name, "pass"),
                f"{name} reason",
            )
            for name in HEALTHY
        ),
    )


ENFORCE = ParityGateConfig(mode=GateMode.ENFORCE)
SEED_BROKEN = {"seed_reproducible": "fail", "n_gt_1": "unsupported"}


class TestParityGate:
    def test_parity_passes(self) -> None:
        """Every capability kept: PASS, one passing component per capability."""
        decision = parity_gate(probe(), ParityGateConfig(), now=NOW)
        assert decision.state is GateState.PASS
        assert decision.name == "parity"
        assert [c.state for c in decision.components] == [GateState.PASS] * len(HEALTHY)
        assert decision.estimate == 0
        assert decision.window_end == NOW - timedelta(minutes=5)

    def test_regression_is_a_warn_mode_fail_by_default(self) -> None:
        """A regression FAILs in warn mode by default, naming each capability and reason."""
        decision = parity_gate(probe(speculative=SEED_BROKEN), ParityGateConfig(), now=NOW)
        assert decision.state is GateState.FAIL
        assert decision.mode is GateMode.WARN and not decision.enforced
        assert "n_gt_1: unsupported (n_gt_1 reason)" in decision.detail
        assert "seed_reproducible: fail (seed_reproducible reason)" in decision.detail
        failed = {c.name for c in decision.components if c.state is GateState.FAIL}
        assert failed == {"parity.n_gt_1", "parity.seed_reproducible"}
        assert decision.estimate == 2

    def test_enforced_regression_trips_the_switch_and_warn_does_not(self) -> None:
        """Enforced, the regression rolls the switch back with the capabilities in the
        reason; in warn mode the same evidence leaves it on."""

        def stepped(config: ParityGateConfig) -> tuple[SwitchState, tuple[Transition, ...]]:
            decision = parity_gate(probe(speculative=SEED_BROKEN), config, now=NOW)
            history = [Evaluation(NOW, (decision,))]
            outcome = step(SwitchState(), history, SwitchPolicyConfig(), now=NOW)
            return outcome.state, outcome.transitions

        state, transitions = stepped(ParityGateConfig())
        assert state.mode is SwitchMode.AUTO and transitions == ()
        state, (transition,) = stepped(ENFORCE)
        assert state.mode is SwitchMode.ROLLED_BACK
        assert transition.actor == "gate:parity"
        assert "seed_reproducible" in transition.reason and "n_gt_1" in transition.reason

    def test_no_probe_is_nodata(self) -> None:
        """No probe yet: NODATA, never FAIL, even enforced."""
        decision = parity_gate(None, ENFORCE, now=NOW)
        assert decision.state is GateState.NODATA
        assert "no capability probe" in decision.detail

    def test_stale_probe_is_nodata(self) -> None:
        """A regression older than two intervals plus ten minutes is no evidence."""
        old = probe(finished=NOW - timedelta(hours=2, minutes=11), speculative=SEED_BROKEN)
        decision = parity_gate(old, ENFORCE, now=NOW, probe_interval_s=3600)
        assert decision.state is GateState.NODATA
        assert "max_probe_age_seconds" in decision.detail
        assert decision.components == ()
        fresh = probe(finished=NOW - timedelta(hours=2, minutes=9), speculative=SEED_BROKEN)
        assert parity_gate(fresh, ENFORCE, now=NOW).state is GateState.FAIL

    def test_configured_age_bound_wins(self) -> None:
        """`max_probe_age_seconds` replaces the bound derived from the schedule."""
        config = ParityGateConfig(max_probe_age_seconds=60)
        assert max_probe_age(config, 3600) == timedelta(seconds=60)
        assert parity_gate(probe(), config, now=NOW).state is GateState.NODATA
        unscheduled = max_probe_age(ParityGateConfig(), 0)
        assert unscheduled == timedelta(hours=2, minutes=10)

    def test_regression_before_the_last_transition_does_not_trip_again(self) -> None:
        """A regression found before the switch moved is NODATA; a pass still counts."""
        since = NOW - timedelta(minutes=1)
        broken = parity_gate(probe(speculative=SEED_BROKEN), ENFORCE, now=NOW, since=since)
        assert broken.state is GateState.NODATA
        assert "before the switch last moved" in broken.detail
        assert parity_gate(probe(), ENFORCE, now=NOW, since=since).state is GateState.PASS
        later = probe(finished=NOW, speculative=SEED_BROKEN)
        assert parity_gate(later, ENFORCE, now=NOW, since=since).state is GateState.FAIL

    def test_capability_the_baseline_lacks_is_no_regression(self) -> None:
        """Both arms failing (or the baseline alone) is parity: PASS, no component for it."""
        lacking = {"n_gt_1": "unsupported", "seed_reproducible": "fail"}
        decision = parity_gate(
            probe(baseline=lacking, speculative=lacking | {"burst_16": "pass"}), ENFORCE, now=NOW
        )
        assert decision.state is GateState.PASS
        assert "the baseline lacks n_gt_1, seed_reproducible too" in decision.detail
        assert {c.name for c in decision.components} == {
            "parity.stop",
            "parity.logprobs",
            "parity.burst_16",
        }


class TestParityConfig:
    def test_warn_by_default(self) -> None:
        """The gate only alerts unless enforce is configured."""
        assert GatesConfig().parity.mode is GateMode.WARN

    def test_unknown_key_is_rejected(self) -> None:
        """A misspelt key fails at load."""
        with pytest.raises(ValidationError):
            GatesConfig.model_validate({"parity": {"max_age": 10}})
