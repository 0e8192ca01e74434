"""The switch policy per category: human commands naming a category, and a per-category
gate's FAIL rolling back only its category under `scope = "category"`."""

from __future__ import annotations

from dataclasses import replace
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
    Transition,
    step,
)
from gates.pairs.testing import T0

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
            category=name,
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


def speedup(n: float, **states: GateState) -> GateDecision:
    """The speedup gate under `scope = "category"`: a component per category."""
    gate = drift(n, **states)
    components = tuple(
        replace(c, name=f"speedup.{c.category}", detail=f"{c.category} speedup")
        for c in gate.components
    )
    return replace(gate, name="speedup", components=components)


AUTO_RESTORE = SwitchPolicyConfig(
    scope="category", auto_restore=True, restore_passes=2, cooldown_seconds=600
)


def run(
    policy: SwitchPolicyConfig, evaluations: list[Evaluation], state: SwitchState | None = None
) -> tuple[SwitchState, list[Transition]]:
    """Step the policy at each evaluation's time, as the daemon does after each one."""
    state = state or SwitchState()
    transitions: list[Transition] = []
    for index, evaluation in enumerate(evaluations):
        outcome = step(state, evaluations[: index + 1], policy, now=evaluation.at)
        state = outcome.state
        transitions.extend(outcome.transitions)
    return state, transitions


class TestCategoryAutoRestore:
    def test_a_tripped_category_restores_after_its_cooldown_and_passes(self) -> None:
        evaluations = [at(1, speedup(1, math=FAIL, code=PASS))]
        evaluations += [at(n, speedup(n, math=PASS, code=PASS)) for n in range(2, 13)]
        state, transitions = run(AUTO_RESTORE, evaluations[:10])  # up to minute 10
        assert not state.enabled_for("math")
        own = state.category("math")
        assert own is not None and own.cooldown_until == minute(11)
        state, transitions = run(AUTO_RESTORE, evaluations)
        assert [(t.category, t.target, t.at) for t in transitions] == [
            ("math", SwitchMode.ROLLED_BACK, minute(1)),
            ("math", SwitchMode.AUTO, minute(11)),
        ]
        restore = transitions[-1]
        assert restore.actor == "gate:all" and "category 'math'" in restore.reason
        assert [d.name for d in restore.evidence] == ["speedup.math"]
        assert state.enabled_for("math") and state.mode is SwitchMode.AUTO

    def test_only_the_categorys_own_checks_count(self) -> None:
        """Math cannot come back on an evaluation that did not judge it, nor on one where
        it failed again; code's state does not matter."""
        evaluations = [at(1, speedup(1, math=FAIL))]
        evaluations += [at(n, speedup(n, code=PASS)) for n in range(12, 15)]
        state, _ = run(AUTO_RESTORE, evaluations)
        assert not state.enabled_for("math")
        evaluations += [at(15, speedup(15, math=PASS, code=FAIL)), at(16, speedup(16, math=PASS))]
        state, transitions = run(AUTO_RESTORE, evaluations)
        assert state.enabled_for("math") and not state.enabled_for("code")
        assert [t.category for t in transitions] == ["math", "code", "math"]

    def test_no_auto_restore_without_the_option(self) -> None:
        evaluations = [at(1, speedup(1, math=FAIL))]
        evaluations += [at(n, speedup(n, math=PASS)) for n in range(2, 30)]
        state, _ = run(SwitchPolicyConfig(scope="category", cooldown_seconds=0), evaluations)
        assert not state.enabled_for("math")

    def test_a_manual_category_rollback_is_never_auto_restored(self) -> None:
        rollback = SwitchEvent("rollback", "ann", "slow", category="math")
        state = step(SwitchState(), [], AUTO_RESTORE, now=minute(0), events=[rollback]).state
        evaluations = [at(n, speedup(n, math=PASS)) for n in range(20, 25)]
        state, transitions = run(AUTO_RESTORE, evaluations, state)
        assert transitions == [] and not state.enabled_for("math")


class TestCategoryLatch:
    policy = SwitchPolicyConfig(
        scope="category", auto_restore=True, restore_passes=1, cooldown_seconds=0, latch_trips=2
    )

    def test_repeated_trips_of_one_category_latch_it(self) -> None:
        evaluations = [
            at(1, speedup(1, math=FAIL, code=PASS)),
            at(2, speedup(2, math=PASS, code=PASS)),  # auto-restored
            at(3, speedup(3, math=FAIL, code=PASS)),  # second trip: latched
            at(4, speedup(4, math=PASS, code=PASS)),
            at(5, speedup(5, math=PASS, code=PASS)),
        ]
        state, transitions = run(self.policy, evaluations)
        assert [(t.category, t.target) for t in transitions] == [
            ("math", SwitchMode.ROLLED_BACK),
            ("math", SwitchMode.AUTO),
            ("math", SwitchMode.ROLLED_BACK),
        ]
        assert "LATCHED after 2 automatic trips of category 'math'" in transitions[-1].reason
        own = state.category("math")
        assert own is not None and own.latched and not state.enabled_for("math")
        assert not state.latched  # the top level is not latched by a category

    def test_a_human_restore_clears_the_categorys_latch(self) -> None:
        evaluations = [
            at(1, speedup(1, math=FAIL)),
            at(2, speedup(2, math=PASS)),
            at(3, speedup(3, math=FAIL)),
            at(4, speedup(4, math=PASS)),
        ]
        state, _ = run(self.policy, evaluations)
        restore = SwitchEvent("restore", "ann", "fixed", category="math")
        outcome = step(state, evaluations, self.policy, now=minute(4.5), events=[restore])
        own = outcome.state.category("math")
        assert own is not None and own.speculative_enabled
        assert (own.latched, own.cooldown_until, own.recent_trips) == (False, None, ())

    def test_each_category_counts_its_own_trips(self) -> None:
        evaluations = [
            at(1, speedup(1, math=FAIL, code=PASS)),
            at(2, speedup(2, math=PASS, code=FAIL)),
        ]
        state, _ = run(self.policy, evaluations)
        for name in ("math", "code"):
            own = state.category(name)
            assert own is not None and not own.latched and len(own.recent_trips) == 1

    def test_trips_outside_the_latch_window_do_not_count(self) -> None:
        policy = self.policy.model_copy(update={"latch_window_seconds": 90.0})
        evaluations = [
            at(1, speedup(1, math=FAIL)),
            at(2, speedup(2, math=PASS)),
            at(4, speedup(4, math=FAIL)),
        ]
        state, _ = run(policy, evaluations)
        own = state.category("math")
        assert own is not None and not own.latched and own.recent_trips == (minute(4),)


def test_a_category_cooldown_ahead_of_the_clock_is_pulled_back() -> None:
    """The clock went back after a trip: the category's cooldown lasts at most
    `cooldown_seconds` from now, and its trips are re-based on now."""
    tripped = step(
        SwitchState(), [at(60, speedup(60, math=FAIL))], AUTO_RESTORE, now=minute(60)
    ).state
    outcome = step(tripped, [], AUTO_RESTORE, now=minute(2))
    own = outcome.state.category("math")
    assert own is not None and own.cooldown_until == minute(12)
    assert own.recent_trips == (minute(2),) and own.since == minute(2)


class TestTopLevelRestoreWithCategoriesOff:
    """A category that is off on its own does not hold the top level back: its checks are
    left out of the top level's restore evidence."""

    policy = SwitchPolicyConfig(
        scope="category", auto_restore=True, restore_passes=1, cooldown_seconds=0
    )

    def tripped(self) -> tuple[SwitchState, list[Evaluation]]:
        """Math rolled back by its speedup check, then everything by a liveness FAIL."""
        evaluations = [
            at(1, liveness(1, PASS), speedup(1, math=FAIL, code=PASS)),
            at(2, liveness(2, FAIL), speedup(2, math=FAIL, code=PASS)),
        ]
        state, _ = run(SwitchPolicyConfig(scope="category", cooldown_seconds=0), evaluations)
        assert state.mode is SwitchMode.ROLLED_BACK and not state.enabled_for("math")
        return state, evaluations

    def test_a_human_restore_reads_only_the_categories_still_on(self) -> None:
        state, evaluations = self.tripped()
        evaluations.append(at(3, liveness(3, PASS), speedup(3, math=FAIL, code=PASS)))
        restore = SwitchEvent("restore", "ann", "fixed")
        outcome = step(state, evaluations, self.policy, now=minute(3), events=[restore])
        assert outcome.state.mode is SwitchMode.AUTO
        assert outcome.state.enabled_for("code") and not outcome.state.enabled_for("math")

    def test_a_failing_category_still_on_refuses_it(self) -> None:
        state, evaluations = self.tripped()
        evaluations.append(at(3, liveness(3, PASS), speedup(3, math=FAIL, code=FAIL)))
        restore = SwitchEvent("restore", "ann", "fixed")
        outcome = step(state, evaluations, self.policy, now=minute(3), events=[restore])
        assert outcome.state.mode is SwitchMode.ROLLED_BACK
        (refusal,) = outcome.refused
        assert "liveness=PASS, speedup=FAIL" in refusal
        assert "(categories rolled back on their own left out: math)" in refusal

    def test_the_gates_restore_the_top_level_around_it(self) -> None:
        state, evaluations = self.tripped()
        evaluations.append(at(3, liveness(3, PASS), speedup(3, math=FAIL, code=PASS)))
        outcome = step(state, evaluations, self.policy, now=minute(3))
        assert [t.actor for t in outcome.transitions] == ["gate:all"]
        assert outcome.state.mode is SwitchMode.AUTO and not outcome.state.enabled_for("math")
