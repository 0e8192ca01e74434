"""gates.cycle: the one judging path — the registry, the window rules, judge and combine."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest

from gates import GateMode, GatesConfig, GateState, SwitchMode, SwitchState
from gates.config import TelemetryGatesConfig
from gates.cycle import (
    GATES,
    PAIR_GATES,
    TELEMETRY_GATES,
    advisory,
    combine,
    evaluate_all,
    judge,
    latest_window,
    may_pin,
    pins,
    section,
    window_bounds,
)
from gates.evidence import Evidence
from gates.pairs.testing import T0, at, record, result
from gates.records import PairRecord
from gates.stats.budget import budget_shares, detector_arl0, detector_count, telemetry_arl0
from gates.telemetry.acceptance import AcceptanceReference, pin_acceptance_reference
from gates.telemetry.intervals import ArmTelemetry, TelemetryEvidence
from gates.telemetry.testing import ArmTraffic, simulate_arm

# Sections of GatesConfig that configure something other than one gate; `telemetry`
# holds one section per telemetry gate.
NOT_GATES = {"budget", "policy", "telemetry"}
SCRAPE_S = 15.0


def healthy(n: int) -> list[PairRecord]:
    return [record(i) for i in range(n)]


def with_errors(arm: ArmTelemetry, rate: float, rng: np.random.Generator) -> ArmTelemetry:
    """`arm` with each interval's requests failing independently at `rate`."""
    return ArmTelemetry.of(
        replace(i, errors=int(rng.binomial(i.requests or 0, rate))) for i in arm.intervals
    )


def evidence(
    intervals: int,
    *,
    speculative_error_rate: float = 0.005,
    seed: int = 0,
    ending: datetime | None = None,
) -> TelemetryEvidence:
    """Both arms at 5 requests per second, 15 s scrapes from T0 (or up to `ending`, the
    judgement's time: evidence that stopped long before it has expired): the baseline
    failing 0.5 % of its requests, the speculative arm 20 % faster with acceptance length
    about 2.5 (3 draft tokens a step), and its concurrent stable alike."""
    rng = np.random.default_rng(seed)
    start = T0 if ending is None else ending - timedelta(seconds=intervals * SCRAPE_S)
    baseline = simulate_arm(rng, ArmTraffic(rps=5.0), intervals=intervals, start=start)
    speculative = simulate_arm(
        rng,
        ArmTraffic(rps=5.0, slowdown=0.8, draft_tokens=3, acceptance=0.69),
        intervals=intervals,
        start=start,
    )
    stable = simulate_arm(
        rng,
        ArmTraffic(rps=5.0, slowdown=0.8, draft_tokens=3, acceptance=0.69),
        intervals=intervals,
        start=start,
    )
    return TelemetryEvidence(
        with_errors(baseline, 0.005, rng),
        with_errors(speculative, speculative_error_rate, rng),
        stable,
    )


def pinned(telemetry: TelemetryEvidence) -> AcceptanceReference | None:
    """The speculative arm's acceptance reference, pinned from its first intervals."""
    config = GatesConfig().telemetry.acceptance
    now = telemetry.speculative.intervals[-1].end
    return pin_acceptance_reference(telemetry.speculative, config, now=now)


def judged_with(telemetry: TelemetryEvidence) -> dict[str, Any]:
    """The evidence's telemetry fields: the telemetry, its scrape interval, its pinned
    reference."""
    return {
        "telemetry": telemetry,
        "scrape_interval_s": SCRAPE_S,
        "acceptance_reference": pinned(telemetry),
    }


# Healthy pairs with drift left out of the verdict (no references pinned in a test).
NO_DRIFT = GatesConfig.model_validate({"drift": {"mode": "warn"}})


class TestRegistry:
    def test_every_gate_has_its_config_section_and_every_section_its_gate(self) -> None:
        """A gate is one registry line: its name is its GatesConfig section, and no
        section configures a gate the registry does not run."""
        names = [spec.name for spec in GATES]
        assert len(names) == len(set(names))
        sections = set(GatesConfig.model_fields) - NOT_GATES
        telemetry = {f"telemetry.{name}" for name in TelemetryGatesConfig.model_fields}
        assert set(names) == sections | telemetry
        assert set(TELEMETRY_GATES) == telemetry
        assert all(section(GatesConfig(), name) for name in PAIR_GATES + TELEMETRY_GATES)

    def test_decisions_carry_the_registry_names_in_its_order(self) -> None:
        """judge reports one decision per gate, named and ordered as the registry."""
        pairs = Evidence(
            healthy(30), state=SwitchState(), with_probe=True, **judged_with(evidence(10))
        )
        judged = judge(pairs, GatesConfig(), at(29))
        assert [d.name for d in judged.decisions] == [spec.name for spec in GATES]

    def test_the_probe_gate_runs_only_when_asked(self) -> None:
        """Without `with_probe` (the verdict, `judge`, the benchmark) only pair gates run."""
        judged = judge(Evidence(healthy(30), state=SwitchState()), GatesConfig(), at(29))
        assert [d.name for d in judged.decisions] == list(PAIR_GATES)
        assert "parity" not in PAIR_GATES


class TestJudge:
    def test_judge_is_evaluate_all_under_the_switch_state(self) -> None:
        """The state's last transition starts the evidence: judge decides as evaluate_all
        does with `since` set to it."""
        records = [record(i, speculative=result(3.0)) for i in range(400)]
        state = SwitchState(generation=1, since=at(200))
        config = GatesConfig()
        judged = judge(Evidence(records, state=state), config, at(399))
        direct = evaluate_all(records, config, now=at(399), since=at(200))
        assert [d.to_dict() for d in judged.decisions] == [d.to_dict() for d in direct]

    def test_an_explicit_since_wins_over_the_state(self) -> None:
        """A revision's window start replaces the switch's evidence start."""
        records = healthy(100)
        pairs = Evidence(records, state=SwitchState(since=at(10)), since=at(90))
        judged = judge(pairs, GatesConfig(), at(99))
        direct = evaluate_all(records, GatesConfig(), now=at(99), since=at(90))
        assert [d.to_dict() for d in judged.decisions] == [d.to_dict() for d in direct]

    def test_a_dead_arm_fails_and_the_verdict_says_which_gate(self) -> None:
        """Every speculative request failing: FAIL, named in one line."""
        records = [record(i, speculative=result(ok=False)) for i in range(20)]
        judged = judge(Evidence(records, subject="revision 'r1'"), GatesConfig(), at(19))
        assert judged.verdict == "FAIL"
        assert "liveness" in judged.reason and "revision 'r1'" in judged.reason
        assert "\n" not in judged.reason

    def test_min_pairs_holds_back_everything_but_fail(self) -> None:
        """Below min_pairs a window is NODATA, not PASS or INCONCLUSIVE."""
        judged = judge(Evidence(healthy(10)), GatesConfig(), at(9), min_pairs=50)
        assert judged.verdict == "NODATA"
        assert "min_pairs=50" in judged.reason


class TestTelemetry:
    def test_without_telemetry_nothing_changes(self) -> None:
        """No telemetry evidence: no telemetry decision, and the pair gates decide exactly
        as evaluate_all with the budget split between the pair detectors alone."""
        records = [record(i, speculative=result(1.3)) for i in range(400)]
        judged = judge(Evidence(records), GatesConfig(), at(399))
        direct = evaluate_all(records, GatesConfig(), now=at(399))
        assert [d.name for d in judged.decisions] == list(PAIR_GATES)
        assert [d.to_dict() for d in judged.decisions] == [d.to_dict() for d in direct]
        assert judged.covered == () and judged.requests == 0
        assert detector_count(GatesConfig()) == 16

    def test_telemetry_takes_its_share_of_the_one_budget(self) -> None:
        """With telemetry each detector's share shrinks to make room for the telemetry
        detectors; a telemetry detector's ARL0 counts scrape intervals."""
        config = GatesConfig()
        count = detector_count(config, telemetry=True)
        # errors 1, latency 3 metrics × 2 quantiles, acceptance 1
        assert count == 16 + 1 + 6 + 1
        # liveness and quality.ties take 1/16 of a share each (gates.stats.budget.MINOR_SHARE)
        shares = count - 1 + 2 / 16
        assert budget_shares(config, telemetry=True) == shares
        assert detector_arl0(config, telemetry=True) == pytest.approx(
            detector_arl0(config) * shares / (16 - 1 + 2 / 16)
        )
        intervals_30d = 30 * 86_400 / SCRAPE_S
        assert telemetry_arl0(config, SCRAPE_S) == pytest.approx(
            intervals_30d * shares / config.budget.false_rollbacks_per_30_days
        )
        records = healthy(200)
        plain = judge(Evidence(records), config, at(199))
        shared = judge(
            Evidence(records, **judged_with(evidence(100, ending=at(199)))), config, at(199)
        )
        threshold = {d.name: d.detector.threshold for d in plain.decisions if d.detector}
        for decision in shared.decisions:
            if decision.detector and decision.name in threshold:
                assert decision.detector.threshold > threshold[decision.name]

    def test_telemetry_needs_its_scrape_interval(self) -> None:
        """The budget's unit for a telemetry detector is the scrape: no interval, no judging."""
        with pytest.raises(ValueError, match="scrape_interval_s"):
            Evidence(healthy(10), telemetry=evidence(5))

    def test_a_telemetry_fail_fails_the_verdict(self) -> None:
        """Healthy pairs, but the speculative arm fails 30 % of its production requests:
        FAIL, named after telemetry.errors."""
        failing = judged_with(evidence(40, speculative_error_rate=0.3, ending=at(399)))
        judged = judge(
            Evidence(healthy(400), subject="revision 'r1'", **failing), NO_DRIFT, at(399)
        )
        assert judged.verdict == "FAIL"
        assert judged.reason.startswith("telemetry.errors FAILed")
        assert "revision 'r1'" in judged.reason

    def test_healthy_telemetry_and_healthy_pairs_pass(self) -> None:
        """Quality PASSes on the pairs and every telemetry gate on production requests:
        PASS, the pair gates the telemetry covers left to it."""
        telemetry = evidence(200, ending=at(399))
        judged = judge(Evidence(healthy(400), **judged_with(telemetry)), NO_DRIFT, at(399))
        states = {d.name: d.state for d in judged.decisions}
        assert states["quality"] is GateState.PASS
        assert all(states[name] is GateState.PASS for name in TELEMETRY_GATES)
        assert judged.verdict == "PASS"
        assert "error" in judged.covered and "left to telemetry" in judged.reason
        assert judged.requests == sum(i.requests or 0 for i in telemetry.speculative.intervals)

    def test_a_covered_pair_gate_no_longer_holds_back_a_pass(self) -> None:
        """Too few pairs for the pair error gate (INCONCLUSIVE alone), enough production
        requests for telemetry.errors: the verdict does not wait for the pair gate."""
        records = healthy(400)
        config = NO_DRIFT.model_copy(
            update={"error": NO_DRIFT.error.model_copy(update={"min_samples": 1000})}
        )
        alone = judge(Evidence(records), config, at(399))
        assert alone.verdict == "INCONCLUSIVE" and "error" in alone.reason
        judged = judge(
            Evidence(records, **judged_with(evidence(200, ending=at(399)))), config, at(399)
        )
        assert judged.verdict == "PASS"

    def test_quality_still_decides(self) -> None:
        """Telemetry covers errors, not answers: too few pairs for quality, no PASS."""
        judged = judge(Evidence(healthy(50), **judged_with(evidence(200))), NO_DRIFT, at(49))
        assert judged.verdict == "INCONCLUSIVE"
        assert "quality" in judged.reason

    def test_no_telemetry_scraped_yet_holds_back_a_pass(self) -> None:
        """Telemetry configured but nothing scraped yet: telemetry.errors is NODATA and
        the verdict waits for it."""
        nothing = Evidence(healthy(400), telemetry=TelemetryEvidence(), scrape_interval_s=SCRAPE_S)
        judged = judge(nothing, NO_DRIFT, at(399))
        assert judged.verdict == "INCONCLUSIVE"
        assert "telemetry.errors NODATA" in judged.reason

    def test_telemetry_gates_in_warn_cover_nothing_and_fail_nothing(self) -> None:
        """In warn mode a telemetry FAIL alerts only, and the pair gates decide alone."""
        warn = {name: {"mode": "warn"} for name in TelemetryGatesConfig.model_fields}
        config = GatesConfig.model_validate({"drift": {"mode": "warn"}, "telemetry": warn})
        failing = judged_with(evidence(40, speculative_error_rate=0.3, ending=at(399)))
        judged = judge(Evidence(healthy(400), **failing), config, at(399))
        assert judged.covered == ()
        assert judged.verdict == "PASS"
        assert next(d for d in judged.decisions if d.name == "telemetry.errors").state is (
            GateState.FAIL
        )

    def test_acceptance_against_the_past_with_drift_undecided_is_set_aside(self) -> None:
        """No concurrent stable and drift undecided: telemetry.acceptance against its pin
        is set aside (NODATA, warn), covers nothing, and the verdict waits on drift, as
        it would without telemetry, instead of PASSing on a reference from another mix."""
        telemetry = evidence(200, ending=at(399))
        alone = TelemetryEvidence(telemetry.baseline, telemetry.speculative)
        config = GatesConfig()  # drift enforced, no references pinned: undecided
        judged = judge(Evidence(healthy(400), **judged_with(alone)), config, at(399))
        acceptance = next(d for d in judged.decisions if d.name == "telemetry.acceptance")
        assert acceptance.state is GateState.NODATA and not acceptance.enforced
        assert "set aside (PASS as read)" in acceptance.detail
        assert "drift" not in judged.covered
        assert judged.verdict == "INCONCLUSIVE" and "drift" in judged.reason
        with_stable = judge(Evidence(healthy(400), **judged_with(telemetry)), config, at(399))
        assert "drift" in with_stable.covered and with_stable.verdict == "PASS"

    def test_a_covered_pair_gate_still_fails_the_verdict(self) -> None:
        """Covered gates count by their FAIL: a dead speculative arm in the pairs FAILs
        however healthy its telemetry looks."""
        records = [record(i, speculative=result(ok=False)) for i in range(20)]
        judged = judge(Evidence(records, **judged_with(evidence(40))), NO_DRIFT, at(19))
        assert "liveness" in judged.covered
        assert judged.verdict == "FAIL" and "liveness" in judged.reason


class TestCombine:
    def test_no_enforce_gate_is_nodata(self) -> None:
        """With every gate in warn, nothing judges: NODATA."""
        decisions = evaluate_all(healthy(10), advisory(GatesConfig()), now=at(9))
        assert combine(decisions, 10, 0, "x")[0] == "NODATA"


class TestWindowRules:
    def test_window_bounds_are_the_longest_pair_gate_window(self) -> None:
        """The longest window any pair gate reads bounds what a judgement loads."""
        config = GatesConfig()
        seconds, pairs = window_bounds(config)
        sections = [getattr(config, name) for name in PAIR_GATES]
        assert pairs == max(s.window_pairs for s in sections)
        assert seconds == max(s.window_seconds for s in sections)

    def test_latest_window_keeps_the_newest_pairs_within_both_bounds(self) -> None:
        """In memory, the window is what the store's query returns: at most the longest
        window's pairs, none older than its span before the newest."""
        config = GatesConfig()
        seconds, pairs = window_bounds(config)
        assert seconds is not None and pairs is not None
        spacing = timedelta(seconds=10)
        records = healthy(pairs + 50)
        window = latest_window(records, config)
        assert window[-1] is records[-1]
        assert len(window) <= pairs
        assert all(
            window[-1].started_at - r.started_at < timedelta(seconds=seconds) for r in window
        )
        assert len(window) == min(pairs, int(seconds / spacing.total_seconds()))

    def test_advisory_puts_every_pair_gate_in_warn(self) -> None:
        """Comparison arms are judged with every pair gate in warn mode."""
        config = advisory(GatesConfig())
        assert all(section(config, name).mode is GateMode.WARN for name in PAIR_GATES)
        assert all(section(config, name).mode is GateMode.WARN for name in TELEMETRY_GATES)


class TestPins:
    def test_pins_come_from_healthy_traffic_only(self) -> None:
        """A drift rollback's own evidence is never pinned; any other state pins."""
        drift_rollback = SwitchState(mode=SwitchMode.ROLLED_BACK, actor="gate:drift")
        other_rollback = SwitchState(mode=SwitchMode.ROLLED_BACK, actor="gate:error")
        assert may_pin(SwitchState())
        assert not may_pin(drift_rollback)
        assert may_pin(other_rollback)
        records = [record(i, speculative=result(0.5, verify_steps=10)) for i in range(200)]
        assert pins(records, {}, drift_rollback, GatesConfig(), at(199)) == {}
        assert pins(records, {}, SwitchState(), GatesConfig(), at(199))

    def test_nothing_to_pin_from_no_pairs(self) -> None:
        """An empty window pins nothing."""
        assert pins([], {}, SwitchState(), GatesConfig(), at(0)) == {}


class TestReplays:
    def test_a_replay_from_another_run_adds_no_evidence(self) -> None:
        """Two daemons replaying the same (prompt, seed) sequence: the second run's copies
        are dropped, so every detector sees each measurement once; within one run nothing
        is dropped."""
        from dataclasses import replace

        from gates.cycle import distinct

        slow = [record(i, speculative=result(1.3)) for i in range(300)]
        replayed = [replace(r, pair_id=f"{r.pair_id}-b", run_id="other") for r in slow]
        assert distinct(slow + replayed) == slow
        once = judge(Evidence(slow), GatesConfig(), at(299))
        both = sorted(slow + replayed, key=lambda r: r.started_at)
        twice = judge(Evidence(both), GatesConfig(), at(299))
        assert twice.pairs == once.pairs == 300
        assert [d.to_dict() for d in twice.decisions] == [d.to_dict() for d in once.decisions]
