"""gates.cycle: the one judging path — the registry, the window rules, judge and combine."""

from __future__ import annotations

from datetime import timedelta

from gates import GateMode, GatesConfig, SwitchMode, SwitchState
from gates.cycle import (
    GATES,
    PAIR_GATES,
    advisory,
    combine,
    evaluate_all,
    judge,
    latest_window,
    may_pin,
    pins,
    window_bounds,
)
from gates.testing import at, record, result

# Sections of GatesConfig that configure something other than one gate.
NOT_GATES = {"budget", "policy"}


def healthy(n: int) -> list:
    return [record(i) for i in range(n)]


class TestRegistry:
    def test_every_gate_has_its_config_section_and_every_section_its_gate(self) -> None:
        """A gate is one registry line: its name is its GatesConfig section, and no
        section configures a gate the registry does not run."""
        names = [spec.name for spec in GATES]
        assert len(names) == len(set(names))
        assert set(names) == set(GatesConfig.model_fields) - NOT_GATES

    def test_decisions_carry_the_registry_names_in_its_order(self) -> None:
        """judge reports one decision per gate, named and ordered as the registry."""
        judged = judge(healthy(30), None, SwitchState(), GatesConfig(), at(29), with_probe=True)
        assert [d.name for d in judged.decisions] == [spec.name for spec in GATES]

    def test_the_probe_gate_runs_only_when_asked(self) -> None:
        """Without `with_probe` (the verdict, `judge`, the benchmark) only pair gates run."""
        judged = judge(healthy(30), None, SwitchState(), GatesConfig(), at(29))
        assert [d.name for d in judged.decisions] == list(PAIR_GATES)
        assert "parity" not in PAIR_GATES


class TestJudge:
    def test_judge_is_evaluate_all_under_the_switch_state(self) -> None:
        """The state's last transition starts the evidence: judge decides as evaluate_all
        does with `since` set to it."""
        records = [record(i, speculative=result(3.0)) for i in range(400)]
        state = SwitchState(generation=1, since=at(200))
        config = GatesConfig()
        judged = judge(records, None, state, config, at(399))
        direct = evaluate_all(records, config, now=at(399), since=at(200))
        assert [d.to_dict() for d in judged.decisions] == [d.to_dict() for d in direct]

    def test_an_explicit_since_wins_over_the_state(self) -> None:
        """A revision's window start replaces the switch's evidence start."""
        records = healthy(100)
        judged = judge(
            records, None, SwitchState(since=at(10)), GatesConfig(), at(99), since=at(90)
        )
        direct = evaluate_all(records, GatesConfig(), now=at(99), since=at(90))
        assert [d.to_dict() for d in judged.decisions] == [d.to_dict() for d in direct]

    def test_a_dead_arm_fails_and_the_verdict_says_which_gate(self) -> None:
        """Every speculative request failing: FAIL, named in one line."""
        records = [record(i, speculative=result(ok=False)) for i in range(20)]
        judged = judge(records, None, None, GatesConfig(), at(19), subject="revision 'r1'")
        assert judged.verdict == "FAIL"
        assert "liveness" in judged.reason and "revision 'r1'" in judged.reason
        assert "\n" not in judged.reason

    def test_min_pairs_holds_back_everything_but_fail(self) -> None:
        """Below min_pairs a window is NODATA, not PASS or INCONCLUSIVE."""
        judged = judge(healthy(10), None, None, GatesConfig(), at(9), min_pairs=50)
        assert judged.verdict == "NODATA"
        assert "min_pairs=50" in judged.reason


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
        assert all(getattr(config, name).mode is GateMode.WARN for name in PAIR_GATES)


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
        once = judge(slow, None, None, GatesConfig(), at(299))
        twice = judge(
            sorted(slow + replayed, key=lambda r: r.started_at), None, None, GatesConfig(), at(299)
        )
        assert twice.pairs == once.pairs == 300
        assert [d.to_dict() for d in twice.decisions] == [d.to_dict() for d in once.decisions]
