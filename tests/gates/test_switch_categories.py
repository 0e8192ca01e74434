"""The switch policy per category: human commands naming a category, and a per-category
gate's FAIL rolling back only its category under `scope = "category"`."""

from __future__ import annotations

from datetime import datetime, timedelta

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
    step,
)
from tests.gates.conftest import T0

GLOBAL = SwitchPolicyConfig()
CATEGORY = SwitchPolicyConfig(scope="category")
PASS, FAIL = GateState.PASS, GateState.FAIL


def minute(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def drift(n: float, **states: GateState) -> GateDecision:
    """The drift gate at minute `n` with a component per category; as the gate does,
    only a component that did not PASS names its category."""
    at = minute(n)
    components = tuple(
        GateDecision(
            name=f"drift.{name}",
            state=state,
            mode=GateMode.ENFORCE,
            critical=False,
            evaluated_at=at,
            window_end=at,
            detail=f"{name} {state.value}",
            categories=(name,) if state is not PASS else (),
        )
        for name, state in states.items()
    )
    worst = FAIL if FAIL in states.values() else PASS
    return GateDecision(
        name="drift",
        state=worst,
        mode=GateMode.ENFORCE,
        critical=False,
        evaluated_at=at,
        window_end=at,
        components=components,
    )


def liveness(n: float, state: GateState) -> GateDecision:
    at = minute(n)
    return GateDecision(
        name="liveness",
        state=state,
        mode=GateMode.ENFORCE,
        critical=True,
        evaluated_at=at,
        window_end=at,
    )


def at(n: float, *decisions: GateDecision) -> Evaluation:
    return Evaluation(minute(n), decisions)


class TestHumanCommands:
    def test_rollback_of_a_category_moves_only_it(self) -> None:
        event = SwitchEvent("rollback", "ann", "slow", category="math")
        outcome = step(SwitchState(), [], GLOBAL, now=minute(1), events=[event])
        state = outcome.state
        assert state.mode is SwitchMode.AUTO and state.generation == 1
        assert not state.enabled_for("math") and state.enabled_for("code")
        (transition,) = outcome.transitions
        assert transition.category == "math" and transition.target is SwitchMode.ROLLED_BACK
        own = state.category("math")
        assert own is not None and own.control is Control.MANUAL and own.generation == 1
        again = step(state, [], GLOBAL, now=minute(2), events=[event])
        assert again.transitions == () and again.state == state

    def test_the_master_rules_every_category(self) -> None:
        rolled = step(
            SwitchState(), [], GLOBAL, now=minute(1), events=[SwitchEvent("rollback", "a", "r")]
        ).state
        assert not rolled.enabled_for("math") and rolled.categories == ()

    def test_restore_needs_the_categorys_own_fresh_pass(self) -> None:
        state = step(
            SwitchState(),
            [],
            CATEGORY,
            now=minute(1),
            events=[SwitchEvent("rollback", "a", "r", category="math")],
        ).state
        restore = SwitchEvent("restore", "a", "ok", category="math")
        failing = [at(2, drift(2, math=FAIL, code=PASS))]
        refused = step(state, failing, CATEGORY, now=minute(3), events=[restore])
        assert refused.transitions == ()
        assert "drift.math=FAIL" in refused.refused[0]
        unjudged = [at(2, drift(2, code=PASS))]
        assert (
            "no enforce gate judged"
            in step(state, unjudged, CATEGORY, now=minute(3), events=[restore]).refused[0]
        )
        stale = [at(2, drift(2, math=PASS))]
        assert (
            "older than"
            in step(state, stale, CATEGORY, now=minute(60), events=[restore]).refused[0]
        )
        passing = [at(2, drift(2, math=PASS, code=PASS))]
        restored = step(state, passing, CATEGORY, now=minute(3), events=[restore])
        assert restored.state.enabled_for("math") and restored.state.generation == 2
        assert restored.transitions[0].evidence[0].name == "drift.math"

    def test_forced_restore_and_auto(self) -> None:
        state = step(
            SwitchState(),
            [],
            GLOBAL,
            now=minute(1),
            events=[SwitchEvent("rollback", "a", "r", category="math")],
        ).state
        handed = step(
            state,
            [],
            GLOBAL,
            now=minute(2),
            events=[SwitchEvent("auto", "a", "g", category="math")],
        ).state
        own = handed.category("math")
        assert own is not None and own.control is Control.GATES and not own.speculative_enabled
        forced = step(
            handed,
            [],
            GLOBAL,
            now=minute(3),
            events=[SwitchEvent("restore", "a", "ok", force=True, category="math")],
        )
        own = forced.state.category("math")
        assert own is not None and own.speculative_enabled and own.reason.startswith("FORCED")


class TestCategoryScope:
    def test_a_category_fail_rolls_back_only_that_category(self) -> None:
        history = [at(1, liveness(1, PASS), drift(1, math=FAIL, code=PASS))]
        outcome = step(SwitchState(), history, CATEGORY, now=minute(1))
        state = outcome.state
        assert state.mode is SwitchMode.AUTO and state.control is Control.GATES
        assert not state.enabled_for("math") and state.enabled_for("code")
        (transition,) = outcome.transitions
        assert transition.category == "math" and transition.actor == "gate:drift.math"
        history.append(at(2, liveness(2, PASS), drift(2, math=FAIL, code=FAIL)))
        later = step(state, history, CATEGORY, now=minute(2))
        assert [t.category for t in later.transitions] == ["code"]
        assert later.state.generation == 2 and later.state.mode is SwitchMode.AUTO

    def test_the_same_fail_under_global_scope_rolls_back_everything(self) -> None:
        history = [at(1, drift(1, math=FAIL, code=PASS))]
        outcome = step(SwitchState(), history, GLOBAL, now=minute(1))
        assert outcome.state.mode is SwitchMode.ROLLED_BACK and outcome.state.categories == ()

    def test_a_global_fault_still_rolls_back_everything(self) -> None:
        history = [at(1, liveness(1, FAIL), drift(1, math=PASS))]
        outcome = step(SwitchState(), history, CATEGORY, now=minute(1))
        assert outcome.state.mode is SwitchMode.ROLLED_BACK
        assert outcome.transitions[0].category is None

    def test_k_of_m_counts_the_categorys_own_failures(self) -> None:
        policy = SwitchPolicyConfig(scope="category", trip_k=2, trip_m=3)
        history = [at(1, drift(1, math=FAIL, code=PASS))]
        state = step(SwitchState(), history, policy, now=minute(1)).state
        assert state.generation == 0
        history.append(at(2, drift(2, math=PASS, code=FAIL)))
        state = step(state, history, policy, now=minute(2)).state
        assert state.generation == 0
        history.append(at(3, drift(3, math=FAIL, code=PASS)))
        outcome = step(state, history, policy, now=minute(3))
        assert [t.category for t in outcome.transitions] == ["math"]

    def test_a_restored_category_is_not_retripped_by_old_failures(self) -> None:
        history = [at(1, drift(1, math=FAIL))]
        state = step(SwitchState(), history, CATEGORY, now=minute(1)).state
        history.append(at(2, drift(2, math=PASS)))
        restore = SwitchEvent("restore", "a", "ok", category="math")
        restored = step(state, history, CATEGORY, now=minute(3), events=[restore])
        assert restored.state.enabled_for("math")
        assert [t.category for t in restored.transitions] == ["math"]

    def test_a_manual_category_is_left_to_the_human(self) -> None:
        rollback = SwitchEvent("rollback", "a", "r", category="math")
        state = step(SwitchState(), [], CATEGORY, now=minute(1), events=[rollback]).state
        history = [at(2, drift(2, math=FAIL))]
        assert step(state, history, CATEGORY, now=minute(2)).transitions == ()


def test_a_category_stamped_ahead_of_the_clock_is_rebased_on_now() -> None:
    """The clock went back after a category moved: its evidence counts from now on."""
    rollback = SwitchEvent("rollback", "a", "r", category="math")
    state = step(SwitchState(), [], CATEGORY, now=minute(30), events=[rollback]).state
    auto = SwitchEvent("auto", "a", "g", category="math")
    state = step(state, [], CATEGORY, now=minute(31), events=[auto]).state
    restore = SwitchEvent("restore", "a", "ok", force=True, category="math")
    state = step(state, [], CATEGORY, now=minute(32), events=[restore]).state
    history = [at(2, drift(2, math=FAIL))]
    outcome = step(state, history, CATEGORY, now=minute(2))
    own = outcome.state.category("math")
    assert own is not None and own.since == minute(2)
    history.append(at(3, drift(3, math=FAIL)))
    later = step(outcome.state, history, CATEGORY, now=minute(3))
    assert [t.category for t in later.transitions] == ["math"]
