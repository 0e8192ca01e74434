"""The switch's records <-> rows: the switch state, its audit entries, gate decisions and
drift references.

This module owns how `gates.SwitchState` (with its categories as JSON) becomes the one
`switch_state` row and comes back as a `SwitchRecord`, how transitions and refused
commands become `switch_audit` rows with their evidence, how an `Evaluation` becomes a
row per gate decision, and how a pinned `ReferenceStats` is stored. Rows are the Core
tables' (`canaryd.store.switching_tables`): values to insert are dicts, rows read are
`Row`s. Fields are mapped by name through `canaryd.store.columns`; the pairs', runs' and
roll-ups' rows are mapped in `canaryd.store.mapping`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from canaryd.store.columns import Convert, from_row, row_values
from canaryd.store.switching import AuditEntry, SwitchRecord
from canaryd.store.switching_tables import (
    drift_references,
    switch_audit,
    switch_state,
)
from gates import (
    CategorySwitch,
    Control,
    Evaluation,
    GateDecision,
    ReferenceStats,
    SwitchMode,
    SwitchState,
    Transition,
)

__all__ = [
    "audit_entry",
    "drift_reference_values",
    "gate_decision_values",
    "initial_switch_values",
    "reference_from_row",
    "refusal_audit_values",
    "state_values",
    "switch_record",
    "transition_audit_values",
]


def _categories_to_json(categories: Iterable[tuple[str, CategorySwitch]]) -> dict[str, Any]:
    return {
        name: {
            **_column_values(own),
            "since": own.since.isoformat() if own.since else None,
            "cooldown_until": own.cooldown_until.isoformat() if own.cooldown_until else None,
            "recent_trips": [t.isoformat() for t in own.recent_trips],
        }
        for name, own in categories
    }


def _categories_from_json(data: dict[str, Any] | None) -> tuple[tuple[str, CategorySwitch], ...]:
    def one(value: dict[str, Any]) -> CategorySwitch:
        # The latch fields are absent from switches stored before categories had them.
        since = value.get("since")
        until = value.get("cooldown_until")
        return CategorySwitch(
            mode=SwitchMode(value["mode"]),
            control=Control(value["control"]),
            generation=int(value["generation"]),
            since=datetime.fromisoformat(since) if since else None,
            actor=str(value["actor"]),
            reason=str(value["reason"]),
            latched=bool(value.get("latched", False)),
            cooldown_until=datetime.fromisoformat(until) if until else None,
            recent_trips=tuple(datetime.fromisoformat(t) for t in value.get("recent_trips", ())),
        )

    return tuple(sorted((name, one(value)) for name, value in (data or {}).items()))


def _column_values(own: CategorySwitch) -> dict[str, Any]:
    return {
        "mode": own.mode.value,
        "control": own.control.value,
        "generation": own.generation,
        "actor": own.actor,
        "reason": own.reason,
        "latched": own.latched,
    }


_TRIPS_TO_JSON: Mapping[str, Convert] = MappingProxyType(
    {
        "recent_trips": lambda trips: [t.isoformat() for t in trips],
        "categories": _categories_to_json,
    }
)
_STATE_FROM_COLUMNS: Mapping[str, Convert] = MappingProxyType(
    {
        "mode": SwitchMode,
        "control": Control,
        "recent_trips": lambda trips: tuple(datetime.fromisoformat(t) for t in trips),
        "categories": _categories_from_json,
    }
)


def state_values(state: SwitchState) -> dict[str, Any]:
    """The `switch_state` columns of `state`."""
    return row_values(state, switch_state, convert=_TRIPS_TO_JSON)


def initial_switch_values() -> dict[str, Any]:
    """The switch row before anything changed it (the only row, id 1)."""
    return {"id": 1, **state_values(SwitchState())}


def switch_record(row: Any) -> SwitchRecord:
    """The stored switch (its `switch_state` row: a Core `Row`, or the ORM model's); the
    initial state when the row was never written (None)."""
    if row is None:
        return SwitchRecord(SwitchState())
    return from_row(
        SwitchRecord,
        row,
        convert={"actuator_errors": lambda errors: dict(errors or {})},
        state=from_row(SwitchState, row, convert=_STATE_FROM_COLUMNS),
    )


def _evidence(decisions: Iterable[GateDecision]) -> list[dict[str, Any]]:
    return [d.to_dict() for d in decisions]


def transition_audit_values(transition: Transition) -> dict[str, Any]:
    """The `switch_audit` row of a transition."""
    return {
        "kind": "transition",
        **row_values(transition, switch_audit, convert={"evidence": _evidence}),
    }


def refusal_audit_values(
    state: SwitchState, at: datetime, actor: str, reason: str, evidence: Iterable[GateDecision]
) -> dict[str, Any]:
    """The `switch_audit` row of a human command refused while the switch was in `state`:
    the mode stays as it is."""
    return dict(
        at=at,
        kind="refused",
        generation=state.generation,
        previous=state.mode.value,
        target=state.mode.value,
        control=state.control.value,
        actor=actor,
        reason=reason,
        evidence=_evidence(evidence),
        category=None,
    )


def audit_entry(row: Any) -> AuditEntry:
    return from_row(AuditEntry, row, convert={"evidence": list})


def gate_decision_values(
    evaluation: Evaluation, comparison_arm: str | None = None
) -> list[dict[str, Any]]:
    """A `gate_decisions` row per gate decision, all at `evaluation.at` (the rows sharing
    it and `comparison_arm` are one evaluation, whatever each decision's own
    `evaluated_at`)."""
    return [
        {
            "evaluated_at": evaluation.at,
            "comparison_arm": comparison_arm,
            "gate": d.name,
            "state": d.state.value,
            "mode": d.mode.value,
            "critical": d.critical,
            "decision": d.to_dict(),
        }
        for d in evaluation.decisions
    ]


def drift_reference_values(
    category: str, stats: ReferenceStats, at: datetime, arms: str
) -> dict[str, Any]:
    """The `drift_references` row pinning `stats` for `category` under `arms` at `at`."""
    return {
        "arms": arms,
        "category": category,
        **row_values(stats, drift_references),
        "pinned_at": at,
    }


def reference_from_row(row: Any) -> ReferenceStats:
    return from_row(ReferenceStats, row)
