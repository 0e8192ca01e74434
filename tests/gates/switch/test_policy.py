"""The switch policy: trip rules, cooldown, latch, restore rules and manual override."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from gates import (
    Control,
    Evaluation,
    GateDecision,
    GateMode,
    GateState,
    SwitchEvent,
    SwitchMode,
    SwitchPolicyConfig,
    SwitchState,
    Transition,
    step,
)
from gates.pairs.testing import T0

POLICY = SwitchPolicyConfig()
K3_OF_5 = SwitchPolicyConfig(trip_k=3, trip_m=5)
K2_OF_3 = SwitchPolicyConfig(trip_k=2, trip_m=3)
AUTO_RESTORE = SwitchPolicyConfig(auto_restore=True, cooldown_seconds=600)


def minute(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def gate(
    state: GateState,
    name: str = "latency",
    *,
    mode: GateMode = GateMode.ENFORCE,
    critical: bool = False,
) -> GateDecision:
    return GateDecision(name=name, state=state, mode=mode, critical=critical, evaluated_at=T0)


def evaluation(n: float, *decisions: GateDecision, newest: float | None = None) -> Evaluation:
    """The evaluation at minute `n`, its windows ending with a pair from minute `newest`
    (by default `n`: every evaluation saw a new pair)."""
    end = minute(n if newest is None else newest)
    return Evaluation(minute(n), tuple(replace(d, window_end=end) for d in decisions))


def run(
    states: list[GateState],
    *,
    policy: SwitchPolicyConfig = POLICY,
    state: SwitchState | None = None,
    start: float = 1,
    **gate_options: object,
) -> tuple[SwitchState, list[Evaluation], list[Transition]]:
    """Feed one evaluation a minute with the given latency states, stepping the policy."""
    state = state or SwitchState()
    history: list[Evaluation] = []
    transitions: list[Transition] = []
    for offset, gate_state in enumerate(states):
        history.append(evaluation(start + offset, gate(gate_state, **gate_options)))  # type: ignore[arg-type]
        outcome = step(state, history, policy, now=minute(start + offset))
        state = outcome.state
        transitions.extend(outcome.transitions)
    return state, history, transitions


F, P, N, W, INC = (
    GateState.FAIL,
    GateState.PASS,
    GateState.NODATA,
    GateState.WARN,
    GateState.INCONCLUSIVE,
)


class TestTrip:
    def test_default_trips_on_the_first_fail(self) -> None:
        """A gate FAIL is already a sequential alarm: by default (1 of 1) the first trips."""
        state, _, transitions = run([P, F])
        assert state.mode is SwitchMode.ROLLED_BACK
        assert transitions[0].at == minute(2)
        assert "FAILed in 1 of the last 1 evaluations" in transitions[0].reason

    def test_three_of_five_failures_trip(self) -> None:
        """With trip_k = 3 of trip_m = 5, FAIL, PASS, FAIL, PASS, FAIL: the third FAIL in
        five evaluations trips."""
        state, _, transitions = run([F, P, F, P, F], policy=K3_OF_5)
        assert state.mode is SwitchMode.ROLLED_BACK
        assert state.generation == 1
        assert len(transitions) == 1
        assert transitions[0].actor == "gate:latency"
        assert transitions[0].evidence[0].state is GateState.FAIL

    def test_two_of_five_do_not_trip(self) -> None:
        """With 3 of 5, isolated FAILs (never 3 in any 5) leave the switch alone."""
        state, _, transitions = run([F, P, P, F, P, P, P, F, P, P], policy=K3_OF_5)
        assert state.mode is SwitchMode.AUTO
        assert transitions == []

    def test_critical_gate_trips_at_once(self) -> None:
        """A single FAIL of a critical gate trips immediately, whatever k-of-m says."""
        state, _, transitions = run([F], critical=True, policy=K3_OF_5)
        assert state.mode is SwitchMode.ROLLED_BACK
        assert "critical" in transitions[0].reason

    def test_warn_and_dry_run_gates_never_trip(self) -> None:
        """FAILs from warn-mode or dry-run gates are recorded but never trip, critical or not."""
        for mode in (GateMode.WARN, GateMode.DRY_RUN):
            state, _, _ = run([F] * 6, mode=mode, critical=True)
            assert state.mode is SwitchMode.AUTO

    def test_nodata_warn_inconclusive_never_trip(self) -> None:
        """Only FAIL counts towards a trip."""
        state, _, _ = run([N, W, INC, N, W, INC, N])
        assert state.mode is SwitchMode.AUTO


class TestNewEvidence:
    def test_same_window_judged_twice_counts_once(self) -> None:
        """With 2 of 3, two FAILing evaluations of the same window (same newest pair) do
        not trip: the second saw no new pair and is not counted."""
        history = [evaluation(1, gate(F)), evaluation(2, gate(F), newest=1)]
        outcome = step(SwitchState(), history, K2_OF_3, now=minute(2))
        assert outcome.state.mode is SwitchMode.AUTO
        assert outcome.transitions == ()

    def test_two_fails_on_new_pairs_trip(self) -> None:
        """With 2 of 3, two FAILing evaluations that each saw new pairs trip."""
        history = [evaluation(1, gate(F)), evaluation(2, gate(F))]
        outcome = step(SwitchState(), history, K2_OF_3, now=minute(2))
        assert outcome.state.mode is SwitchMode.ROLLED_BACK
        assert "FAILed in 2 of the last 2 evaluations" in outcome.transitions[0].reason

    def test_repeats_are_skipped_not_counted_as_passes(self) -> None:
        """A repeat of the same window between two FAILs on new pairs neither counts nor
        pushes the first FAIL out of the last 3: the second new FAIL trips."""
        history = [
            evaluation(1, gate(F)),
            evaluation(2, gate(F), newest=1),
            evaluation(3, gate(P), newest=1),
            evaluation(4, gate(F)),
        ]
        outcome = step(SwitchState(), history, K2_OF_3, now=minute(4))
        assert outcome.state.mode is SwitchMode.ROLLED_BACK

    def test_evaluations_naming_no_window_are_counted(self) -> None:
        """An evaluation whose decisions name no window cannot be shown to repeat one, so
        it counts: two such FAILs trip 2 of 3."""
        history = [Evaluation(minute(1), (gate(F),)), Evaluation(minute(2), (gate(F),))]
        outcome = step(SwitchState(), history, K2_OF_3, now=minute(2))
        assert outcome.state.mode is SwitchMode.ROLLED_BACK


class TestCooldownLatchRestore:
    def test_no_auto_restore_by_default(self) -> None:
        """With auto_restore off, any amount of PASS evidence leaves the switch rolled back."""
        state, _, _ = run([F, *[P] * 100])
        assert state.mode is SwitchMode.ROLLED_BACK

    def test_auto_restore_waits_for_cooldown_and_fresh_passes(self) -> None:
        """Allowed auto-restore happens after the 10-minute cooldown and 3 PASSes since the
        trip, by actor gate:all, and bumps the generation."""
        state, _, transitions = run([F, F, F, *[P] * 12], policy=AUTO_RESTORE)
        assert state.mode is SwitchMode.AUTO
        assert state.generation == 2
        assert transitions[0].at == minute(1)  # the first FAIL trips (1 of 1)
        assert transitions[1].actor == "gate:all"
        assert transitions[1].at == minute(1 + 10)  # cooldown ends at 11, 3 PASSes by then

    def test_nodata_never_restores(self) -> None:
        """NODATA and INCONCLUSIVE evidence never restores, however long it lasts."""
        state, _, _ = run([F, F, F, *[N, INC] * 50], policy=AUTO_RESTORE)
        assert state.mode is SwitchMode.ROLLED_BACK

    def test_latch_after_three_trips_in_a_day(self) -> None:
        """The third automatic trip within 24 h latches: auto-restore stops, a human restore
        with fresh PASS evidence unlatches."""
        cycle = [F, F, F, *[P] * 13]
        state, history, _ = run(cycle * 3, policy=AUTO_RESTORE)
        assert state.mode is SwitchMode.ROLLED_BACK
        assert state.latched
        state, history, _ = run([P] * 30, policy=AUTO_RESTORE, state=state, start=100)
        assert state.mode is SwitchMode.ROLLED_BACK
        outcome = step(
            state, history, AUTO_RESTORE, now=minute(130),
            events=[SwitchEvent("restore", "alice", "fixed the drafter")],
        )  # fmt: skip
        assert outcome.state.mode is SwitchMode.AUTO
        assert not outcome.state.latched
        assert outcome.transitions[0].actor == "user:alice"

    def test_trips_older_than_the_latch_window_do_not_latch(self) -> None:
        """Three trips spread over more than 24 h do not latch."""
        cycle = [F, F, F, *[P] * 13]
        state, _, _ = run(cycle, policy=AUTO_RESTORE)
        state, _, _ = run(cycle, policy=AUTO_RESTORE, state=state, start=60 * 13)
        state, _, _ = run(cycle, policy=AUTO_RESTORE, state=state, start=60 * 26)
        assert not state.latched
        assert state.mode is SwitchMode.AUTO


class TestManualOverride:
    def test_rollback_wins_over_passing_gates(self) -> None:
        """A human rollback takes effect with every gate passing, and gates cannot undo it."""
        history = [evaluation(1, gate(P))]
        outcome = step(
            SwitchState(), history, AUTO_RESTORE, now=minute(1),
            events=[SwitchEvent("rollback", "bob", "incident 42")],
        )  # fmt: skip
        assert outcome.state.mode is SwitchMode.ROLLED_BACK
        assert outcome.state.control is Control.MANUAL
        state, _, _ = run([P] * 30, policy=AUTO_RESTORE, state=outcome.state, start=2)
        assert state.mode is SwitchMode.ROLLED_BACK

    def test_auto_returns_control_to_gates(self) -> None:
        """After `auto`, gates may restore (where allowed) on fresh PASS evidence only."""
        rolled = step(
            SwitchState(), [], AUTO_RESTORE, now=minute(0),
            events=[SwitchEvent("rollback", "bob", "test")],
        ).state  # fmt: skip
        handed = step(
            rolled, [], AUTO_RESTORE, now=minute(1), events=[SwitchEvent("auto", "bob", "done")]
        )
        assert handed.state.control is Control.GATES
        assert handed.state.generation == 2
        state, _, _ = run([P] * 3, policy=AUTO_RESTORE, state=handed.state, start=2)
        assert state.mode is SwitchMode.AUTO

    def test_restore_needs_fresh_passing_evidence(self) -> None:
        """A restore is refused on NODATA, on stale evidence, and with no evaluation; it is
        carried out on a fresh all-PASS evaluation."""
        tripped, history, _ = run([F, F, F])
        for evidence, now in (
            ([evaluation(4, gate(N))], minute(4)),
            ([evaluation(4, gate(P))], minute(4 + 16)),
            ([], minute(4)),
        ):
            outcome = step(
                tripped, [*history, *evidence], POLICY, now=now,
                events=[SwitchEvent("restore", "carol", "try")],
            )  # fmt: skip
            assert outcome.state == tripped
            assert outcome.refused and "refused" in outcome.refused[0]
        outcome = step(
            tripped, [*history, evaluation(4, gate(P))], POLICY, now=minute(5),
            events=[SwitchEvent("restore", "carol", "verified")],
        )  # fmt: skip
        assert outcome.state.mode is SwitchMode.AUTO
        assert outcome.state.generation == tripped.generation + 1

    def test_forced_restore_is_recorded_as_forced(self) -> None:
        """A forced restore goes through without evidence and says so in the audit reason."""
        tripped, history, _ = run([F, F, F])
        outcome = step(
            tripped, history, POLICY, now=minute(4),
            events=[SwitchEvent("restore", "dave", "gate is wrong", force=True)],
        )  # fmt: skip
        assert outcome.state.mode is SwitchMode.AUTO
        assert outcome.transitions[0].reason.startswith("FORCED")

    def test_old_failures_do_not_retrip_after_restore(self) -> None:
        """Evaluations before a transition never count after it."""
        tripped, history, _ = run([F, F, F])
        history.append(evaluation(4, gate(P)))
        restored = step(
            tripped, history, POLICY, now=minute(5),
            events=[SwitchEvent("restore", "carol", "ok")],
        ).state  # fmt: skip
        again = step(restored, history, POLICY, now=minute(6))
        assert again.state.mode is SwitchMode.AUTO

    def test_generation_only_grows(self) -> None:
        """Every transition bumps the generation by one; no-op commands change nothing."""
        state = SwitchState()
        seen = [state.generation]
        for action in ("rollback", "rollback", "auto", "auto"):
            state = step(
                state, [], POLICY, now=minute(len(seen)),
                events=[SwitchEvent(action, "eve", "x")],
            ).state  # fmt: skip
            seen.append(state.generation)
        assert seen == [0, 1, 1, 2, 2]

    @pytest.mark.parametrize("mode", [SwitchMode.AUTO, SwitchMode.ROLLED_BACK])
    def test_speculative_enabled_follows_mode(self, mode: SwitchMode) -> None:
        """Production reads speculative_enabled: on only in auto mode."""
        assert SwitchState(mode=mode).speculative_enabled is (mode is SwitchMode.AUTO)


class TestClockBehind:
    """The clock went back after a transition: its times are ahead of `now`."""

    def test_a_since_ahead_of_now_is_pulled_back_and_the_next_failure_trips(self) -> None:
        """A restore stamped a year ahead does not blind the gates until next year: the
        first step re-bases `since` on now (no transition), the next failure trips."""
        restored = SwitchState(generation=4, since=minute(60 * 24 * 365), actor="user:bob")
        history = [evaluation(1, gate(F, critical=True))]
        first = step(restored, history, POLICY, now=minute(1))
        assert first.transitions == () and first.state.since == minute(1)
        assert first.state.generation == 4
        history.append(evaluation(2, gate(F, critical=True)))
        second = step(first.state, history, POLICY, now=minute(2))
        assert second.state.mode is SwitchMode.ROLLED_BACK and second.state.generation == 5

    def test_a_cooldown_and_trips_ahead_of_now_are_capped(self) -> None:
        """A trip stamped a year ahead would hold the cooldown for a year and count in
        the latch window for ever: both are re-based on now."""
        far = minute(60 * 24 * 365)
        tripped = SwitchState(
            mode=SwitchMode.ROLLED_BACK,
            generation=1,
            since=far,
            cooldown_until=far + timedelta(seconds=600),
            recent_trips=(far,),
        )
        outcome = step(tripped, [], AUTO_RESTORE, now=minute(1))
        assert outcome.state.cooldown_until == minute(1) + timedelta(seconds=600)
        assert outcome.state.recent_trips == (minute(1),)
        assert outcome.state.since == minute(1) and outcome.transitions == ()

    def test_times_behind_now_are_left_alone(self) -> None:
        """Without a clock jump the state is returned unchanged."""
        state = SwitchState(generation=2, since=minute(1), cooldown_until=minute(5))
        assert step(state, [], POLICY, now=minute(3)).state == state
