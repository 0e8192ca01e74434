"""The switch's record <-> row mapping: every column is written, and the switch, its
categories and gate decisions come back unchanged.

Most fields are mapped by name, so a field renamed or added on one side only would be
silently dropped; these tests catch that without a database.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from canaryd.store.models import SwitchStateRow
from canaryd.store.switching import decision_from_dict
from canaryd.store.switching_mapping import (
    initial_switch_values,
    refusal_audit_values,
    state_values,
    switch_record,
    transition_audit_values,
)
from canaryd.store.switching_tables import switch_audit, switch_state
from gates import (
    CategorySwitch,
    Control,
    GateDecision,
    GateMode,
    GateState,
    SwitchMode,
    SwitchState,
    Transition,
)

AT = datetime(2025, 11, 29, 12, tzinfo=UTC)


def test_the_switch_row_and_audit_rows_are_complete() -> None:
    values = initial_switch_values()
    assert set(values) == set(switch_state.c.keys()) - {
        "applied_generation",
        "actuator_errors",
        "actuated_at",
        "gates_completed_at",
    }
    assert switch_record(SwitchStateRow(**values)).state.mode is SwitchMode.AUTO
    decision = GateDecision("liveness", GateState.FAIL, GateMode.ENFORCE, True, AT)
    transition = Transition(
        AT, 1, SwitchMode.AUTO, SwitchMode.ROLLED_BACK, Control.GATES, "gate:x", "why", (decision,)
    )
    row = transition_audit_values(transition)
    assert set(switch_audit.c.keys()) - set(row) == {"id"}
    assert (row["previous"], row["target"], row["control"]) == ("auto", "rolled_back", "gates")
    assert row["evidence"] == [decision.to_dict()]
    refusal = refusal_audit_values(SwitchState(), AT, "user:ops", "gates failing", (decision,))
    assert set(switch_audit.c.keys()) - set(refusal) == {"id"}


def test_a_categorys_latch_cooldown_and_trips_come_back_unchanged() -> None:
    own = CategorySwitch(
        SwitchMode.ROLLED_BACK,
        Control.GATES,
        3,
        AT,
        "gate:speedup.math",
        "slow",
        latched=True,
        cooldown_until=AT + timedelta(minutes=30),
        recent_trips=(AT - timedelta(hours=1), AT),
    )
    state = SwitchState(generation=3).with_category("math", own)
    assert switch_record(SwitchStateRow(id=1, **state_values(state))).state == state


def test_a_category_stored_before_it_had_a_latch_reads_as_unlatched() -> None:
    values = state_values(SwitchState(generation=1).with_category("math", CategorySwitch()))
    for field in ("latched", "cooldown_until", "recent_trips"):
        del values["categories"]["math"][field]
    own = switch_record(SwitchStateRow(id=1, **values)).state.category("math")
    assert own == CategorySwitch()


def test_a_decisions_category_survives_storage() -> None:
    check = GateDecision(
        "speedup.math", GateState.FAIL, GateMode.ENFORCE, False, AT, category="math"
    )
    decision = GateDecision(
        "speedup", GateState.FAIL, GateMode.ENFORCE, False, AT, components=(check,)
    )
    assert decision_from_dict(decision.to_dict()) == decision
