"""The record <-> row mapping: every column is written, and records come back unchanged.

Most fields are mapped by name, so a field renamed or added on one side only would be
silently dropped; these tests catch that without a database.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import inspect

from canaryd.store.mapping import (
    initial_switch_values,
    pair_from_row,
    pair_row,
    prompt_values,
    run_from_row,
    run_row,
    state_values,
    switch_record,
    transition_audit_row,
)
from canaryd.store.models import (
    Base,
    GenerationRow,
    PromptRow,
    SwitchAuditRow,
    SwitchStateRow,
)
from canaryd.store.switching import decision_from_dict
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
from gates.records import PairRecord, RunInfo

AT = datetime(2025, 11, 29, 12, tzinfo=UTC)


def unset_columns(row: Base) -> set[str]:
    """Columns of `row` the mapping left unset (the database would store its default)."""
    columns = {attribute.key for attribute in inspect(type(row)).column_attrs}
    return columns - set(vars(row))


def test_a_pair_sets_every_column_of_its_rows(pair: Any) -> None:
    record: PairRecord = pair()
    row = pair_row(record, prompt_ref=7)
    assert unset_columns(row) == set()
    assert row.scores is not None
    assert unset_columns(row.scores) == {"pair_id"}  # set from the pair on flush
    for generation in row.generations:
        assert unset_columns(generation) == {"pair_id"}
    assert set(prompt_values(record.prompt)) == {
        attribute.key for attribute in inspect(PromptRow).column_attrs
    } - {"id"}


def test_a_pair_comes_back_unchanged(pair: Any, failed: Any) -> None:
    for record in (pair(), failed()):
        row = pair_row(record, prompt_ref=7)
        row.prompt = PromptRow(**prompt_values(record.prompt))
        assert pair_from_row(row) == record


def test_an_unreported_speculative_arm_stores_null_not_zero(failed: Any) -> None:
    row = pair_row(failed(), prompt_ref=7)
    speculative = next(g for g in row.generations if g.arm == "speculative")
    assert isinstance(speculative, GenerationRow)
    assert speculative.verify_steps is None and speculative.speculative_source is None
    assert speculative.accepted_per_position is None


def test_a_run_comes_back_unchanged(run_info: Any) -> None:
    info: RunInfo = run_info()
    row = run_row(info)
    assert unset_columns(row) == set()
    stored = run_from_row(row)
    assert stored.info == info and stored.finished_at is None


def test_the_switch_row_and_audit_rows_are_complete() -> None:
    values = initial_switch_values()
    assert set(values) == {attribute.key for attribute in inspect(SwitchStateRow).column_attrs} - {
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
    row = transition_audit_row(transition)
    assert isinstance(row, SwitchAuditRow)
    assert unset_columns(row) == {"id"}
    assert (row.previous, row.target, row.control) == ("auto", "rolled_back", "gates")
    assert row.evidence == [decision.to_dict()]


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
