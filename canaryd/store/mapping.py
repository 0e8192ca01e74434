"""Records <-> rows: how every domain record the store keeps becomes its rows, and back.

This module owns the mapping between the records (`RunInfo`, `PairRecord` with its
`Prompt`, `GenerationResult`s and `PairScores`; `PairFacts` and `PairRollup`; the switch
state, its audit entries, gate decisions and drift references) and the ORM models of
`canaryd.store.models`. A record field stored in a column of the same name is mapped
generically (enums by value, tuples as JSON lists); only fields that genuinely differ (a
nested record, a renamed column, JSON with its own shape) are spelled out. Naive
datetimes are refused before they reach a row.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Select, and_, inspect, select
from sqlalchemy.orm import aliased

from canaryd.store.abc import StoredRun
from canaryd.store.models import (
    Base,
    DriftReferenceRow,
    GateDecisionRow,
    GenerationRow,
    PairRollupRow,
    PairRow,
    PairScoresRow,
    PromptRow,
    RunRow,
    SwitchAuditRow,
    SwitchStateRow,
)
from canaryd.store.rollup import (
    ACCEPTANCE_LENGTH_BOUNDS,
    LATENCY_BOUNDS_S,
    SPEEDUP_BOUNDS,
    ArmFacts,
    ArmRollup,
    PairFacts,
    PairRollup,
)
from canaryd.store.switching import AuditEntry, SwitchRecord
from engine.types import (
    AcceptanceSource,
    DraftCost,
    ErrorKind,
    GenerationResult,
    Message,
    Role,
    SpeculativeStats,
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
from gates.records import ARMS, Arm, Check, CheckKind, PairRecord, PairScores, Prompt, RunInfo

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "audit_entry",
    "aware",
    "drift_reference_values",
    "facts_from_columns",
    "facts_query",
    "gate_decision_rows",
    "initial_switch_values",
    "pair_from_row",
    "pair_row",
    "prompt_content_hash",
    "prompt_values",
    "reference_from_row",
    "refusal_audit_row",
    "rollup_from_row",
    "rollup_values",
    "run_from_row",
    "run_row",
    "state_values",
    "switch_record",
    "transition_audit_row",
]

R = TypeVar("R", bound="DataclassInstance")
_Convert = Callable[[Any], Any]
_NONE: Mapping[str, Any] = MappingProxyType({})


# --- records <-> rows -----------------------------------------------------------------


def aware(value: datetime, what: str) -> datetime:
    """`value` itself; `ValueError` when it is naive (its zone would be a guess)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} {value!r} is naive; canaryd stores timezone-aware UTC")
    return value


@cache
def _columns(model: type[Base]) -> frozenset[str]:
    return frozenset(attribute.key for attribute in inspect(model).column_attrs)


def _column_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _row_values(
    record: DataclassInstance,
    model: type[Base],
    *,
    renamed: Mapping[str, str] = _NONE,
    convert: Mapping[str, _Convert] = _NONE,
) -> dict[str, Any]:
    """The fields of `record` that `model` has a column for (of the same name unless
    `renamed`), as the column stores them: through `convert`, else enums by value and
    tuples as lists. Fields without a column (nested records) are left to the caller."""
    columns = _columns(model)
    values: dict[str, Any] = {}
    for spec in fields(record):
        column = renamed.get(spec.name, spec.name)
        if column in columns:
            value = getattr(record, spec.name)
            values[column] = (
                convert[spec.name](value) if spec.name in convert else (_column_value(value))
            )
    return values


def _from_row(
    record_type: type[R],
    row: Base,
    *,
    renamed: Mapping[str, str] = _NONE,
    convert: Mapping[str, _Convert] = _NONE,
    **nested: Any,
) -> R:
    """A `record_type` read from the columns of `row` named like its fields (or `renamed`),
    through `convert`; fields without a column are given as `nested`."""
    columns = _columns(type(row))
    values = dict(nested)
    for spec in fields(record_type):
        column = renamed.get(spec.name, spec.name)
        if spec.name not in nested and column in columns:
            value = getattr(row, column)
            values[spec.name] = convert[spec.name](value) if spec.name in convert else value
    return record_type(**values)


def _tuple(value: Iterable[Any] | None) -> tuple[Any, ...]:
    return tuple(value or ())


def _check_to_json(check: Check | None) -> dict[str, Any] | None:
    if check is None:
        return None
    return {"kind": check.kind, "value": check.value, "tolerance": check.tolerance}


def _check_from_json(data: dict[str, Any] | None) -> Check | None:
    if data is None:
        return None
    return Check(
        kind=cast(CheckKind, data["kind"]), value=data["value"], tolerance=float(data["tolerance"])
    )


def _messages_to_json(messages: Sequence[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def _messages_from_json(data: list[dict[str, str]]) -> tuple[Message, ...]:
    return tuple(Message(role=cast(Role, m["role"]), content=m["content"]) for m in data)


def prompt_content_hash(prompt: Prompt) -> str:
    """sha256 over everything that changes what a prompt asks (not where it is defined)."""
    content = {
        "suite": prompt.suite,
        "id": prompt.id,
        "category": prompt.category,
        "messages": _messages_to_json(prompt.messages),
        "max_tokens": prompt.max_tokens,
        "reference": prompt.reference,
        "check": _check_to_json(prompt.check),
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


_PROMPT_COLUMNS = MappingProxyType({"id": "prompt_id", "check": "answer_check"})


def prompt_values(prompt: Prompt) -> dict[str, Any]:
    """The `prompts` row of `prompt`, keyed by its content hash."""
    return {
        "content_hash": prompt_content_hash(prompt),
        **_row_values(
            prompt,
            PromptRow,
            renamed=_PROMPT_COLUMNS,
            convert={"messages": _messages_to_json, "check": _check_to_json},
        ),
    }


def _prompt_from_row(row: PromptRow) -> Prompt:
    return _from_row(
        Prompt,
        row,
        renamed=_PROMPT_COLUMNS,
        convert={"messages": _messages_from_json, "check": _check_from_json},
    )


# `SpeculativeStats` is stored flat in its generation's row; all NULL when not reported.
_SPECULATIVE_COLUMNS = MappingProxyType({"source": "speculative_source"})
_SPECULATIVE_FROM_COLUMNS: Mapping[str, _Convert] = MappingProxyType(
    {
        "accepted_per_position": _tuple,
        "drafted_per_position": _tuple,
        "source": lambda value: AcceptanceSource(value or AcceptanceSource.DECODING_LOOP),
    }
)
_GENERATION_FROM_COLUMNS: Mapping[str, _Convert] = MappingProxyType(
    {"token_ids": tuple, "error": ErrorKind, "acceptance_source": AcceptanceSource}
)


def _generation_row(arm: Arm, result: GenerationResult) -> GenerationRow:
    stats = result.speculative
    if stats is None:
        speculative = {
            _SPECULATIVE_COLUMNS.get(spec.name, spec.name): None
            for spec in fields(SpeculativeStats)
        }
    else:
        speculative = _row_values(stats, GenerationRow, renamed=_SPECULATIVE_COLUMNS)
    cost = result.draft_cost
    draft_cost = (
        {spec.name: None for spec in fields(DraftCost)}
        if cost is None
        else _row_values(cost, GenerationRow)
    )
    return GenerationRow(arm=arm, **_row_values(result, GenerationRow), **speculative, **draft_cost)


def _generation_from_row(row: GenerationRow) -> GenerationResult:
    stats = None
    if row.verify_steps is not None:
        stats = _from_row(
            SpeculativeStats,
            row,
            renamed=_SPECULATIVE_COLUMNS,
            convert=_SPECULATIVE_FROM_COLUMNS,
        )
    cost = None if row.draft_s is None else _from_row(DraftCost, row)
    return _from_row(
        GenerationResult,
        row,
        convert=_GENERATION_FROM_COLUMNS,
        speculative=stats,
        draft_cost=cost,
    )


def _arm_order(stored: Sequence[str]) -> tuple[Arm, Arm]:
    first, second = stored
    if first not in ARMS or second not in ARMS:  # pragma: no cover - schema written by us
        raise ValueError(f"stored arm order {stored!r} is not two of {ARMS}")
    return first, second


_PAIR_COLUMNS = MappingProxyType({"sampling_seed": "seed"})


def pair_row(record: PairRecord, prompt_ref: int) -> PairRow:
    """The `pairs` row of `record` with its two generations and its scores; the prompt is
    stored separately (`prompt_values`) and referred to by `prompt_ref`."""
    return PairRow(
        **_row_values(record, PairRow, renamed=_PAIR_COLUMNS),
        prompt_ref=prompt_ref,
        category=record.prompt.category,
        complete=record.complete,
        generations=[
            _generation_row("baseline", record.baseline),
            _generation_row("speculative", record.speculative),
        ],
        scores=(
            None
            if record.scores is None
            else PairScoresRow(**_row_values(record.scores, PairScoresRow))
        ),
    )


def pair_from_row(row: PairRow) -> PairRecord:
    """The record stored as `row` with its prompt, generations and scores."""
    by_arm = {generation.arm: generation for generation in row.generations}
    return _from_row(
        PairRecord,
        row,
        renamed=_PAIR_COLUMNS,
        convert={"arm_order": _arm_order},
        prompt=_prompt_from_row(row.prompt),
        baseline=_generation_from_row(by_arm["baseline"]),
        speculative=_generation_from_row(by_arm["speculative"]),
        scores=None if row.scores is None else _from_row(PairScores, row.scores),
    )


def run_row(run: RunInfo) -> RunRow:
    """The `runs` row of a run just started."""
    return RunRow(**_row_values(run, RunRow), finished_at=None)


def run_from_row(row: RunRow) -> StoredRun:
    return StoredRun(info=_from_row(RunInfo, row), finished_at=row.finished_at)


# --- facts and roll-ups <-> rows ------------------------------------------------------

_BASELINE = aliased(GenerationRow, name="baseline_generation")
_SPECULATIVE = aliased(GenerationRow, name="speculative_generation")


def facts_query() -> Select[Any]:
    """Pairs with both generations and their scores, as the columns `PairFacts` needs."""
    return (
        select(
            PairRow.pair_id,
            PairRow.category,
            PairRow.started_at,
            *(
                getattr(arm, column)
                for arm in (_BASELINE, _SPECULATIVE)
                for column in ("error", "output_tokens", "e2e_s", "ttft_s", "tpot_s")
            ),
            _SPECULATIVE.verify_steps,
            _SPECULATIVE.draft_tokens,
            _SPECULATIVE.accepted_tokens,
            _SPECULATIVE.accepted_per_position,
            _SPECULATIVE.drafted_per_position,
            PairScoresRow.exact_match,
            PairScoresRow.task_score_delta,
            PairRow.arm,
        )
        .join(_BASELINE, and_(_BASELINE.pair_id == PairRow.pair_id, _BASELINE.arm == "baseline"))
        .join(
            _SPECULATIVE,
            and_(_SPECULATIVE.pair_id == PairRow.pair_id, _SPECULATIVE.arm == "speculative"),
        )
        .outerjoin(PairScoresRow, PairScoresRow.pair_id == PairRow.pair_id)
    )


def facts_from_columns(row: Sequence[Any]) -> PairFacts:
    """The facts of one pair from a row of `facts_query`."""
    (pair_id, category, started_at, *arms) = row[:13]
    verify, drafted, accepted, per_position, drafted_per_position, exact, delta, arm = row[13:]
    return PairFacts(
        pair_id=pair_id,
        category=category,
        started_at=started_at,
        baseline=ArmFacts(*arms[0:5]),
        speculative=ArmFacts(*arms[5:10]),
        verify_steps=verify,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        accepted_per_position=None if per_position is None else tuple(per_position),
        drafted_per_position=None if drafted_per_position is None else tuple(drafted_per_position),
        exact_match=exact,
        task_score_delta=delta,
        arm=arm,
    )


def rollup_values(rollup: PairRollup) -> dict[str, Any]:
    """The `pair_rollups` columns of a roll-up: arm fields are prefixed with the arm."""
    values: dict[str, Any] = {}
    for spec in fields(PairRollup):
        value = getattr(rollup, spec.name)
        if isinstance(value, ArmRollup):
            for arm_spec in fields(ArmRollup):
                values[f"{spec.name}_{arm_spec.name}"] = _column_value(
                    getattr(value, arm_spec.name)
                )
        else:
            values[spec.name] = _column_value(value)
    return values


_HISTOGRAM_BUCKETS = {
    "speedup_histogram": len(SPEEDUP_BOUNDS) + 1,
    "acceptance_length_histogram": len(ACCEPTANCE_LENGTH_BOUNDS) + 1,
    "e2e_histogram": len(LATENCY_BOUNDS_S) + 1,
    "ttft_histogram": len(LATENCY_BOUNDS_S) + 1,
    "tpot_histogram": len(LATENCY_BOUNDS_S) + 1,
}


def _stored(name: str, value: Any) -> Any:
    if isinstance(value, list):
        buckets = _HISTOGRAM_BUCKETS.get(name)
        if buckets is not None and len(value) != buckets:
            raise ValueError(
                f"stored {name} has {len(value)} buckets, this canaryd uses {buckets}; the "
                f"bucket bounds changed without a migration"
            )
        return tuple(value)
    if isinstance(value, dict):
        return {str(k): int(v) for k, v in sorted(value.items())}
    return value


def rollup_from_row(row: PairRollupRow) -> PairRollup:
    """The roll-up stored as `row`; `ValueError` when its histograms have other buckets."""
    arms = {
        arm: ArmRollup(
            **{
                spec.name: _stored(spec.name, getattr(row, f"{arm}_{spec.name}"))
                for spec in fields(ArmRollup)
            }
        )
        for arm in ("baseline", "speculative")
    }
    plain: dict[str, Any] = {
        spec.name: _stored(spec.name, getattr(row, spec.name))
        for spec in fields(PairRollup)
        if spec.name not in arms
    }
    return PairRollup(**plain, baseline=arms["baseline"], speculative=arms["speculative"])


# --- the switch, its audit trail, gate decisions, drift references <-> rows -----------


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


_TRIPS_TO_JSON: Mapping[str, _Convert] = MappingProxyType(
    {
        "recent_trips": lambda trips: [t.isoformat() for t in trips],
        "categories": _categories_to_json,
    }
)
_STATE_FROM_COLUMNS: Mapping[str, _Convert] = MappingProxyType(
    {
        "mode": SwitchMode,
        "control": Control,
        "recent_trips": lambda trips: tuple(datetime.fromisoformat(t) for t in trips),
        "categories": _categories_from_json,
    }
)


def state_values(state: SwitchState) -> dict[str, Any]:
    """The `switch_state` columns of `state`."""
    return _row_values(state, SwitchStateRow, convert=_TRIPS_TO_JSON)


def initial_switch_values() -> dict[str, Any]:
    """The switch row before anything changed it (the only row, id 1)."""
    return {"id": 1, **state_values(SwitchState())}


def switch_record(row: SwitchStateRow | None) -> SwitchRecord:
    """The stored switch; the initial state when the row was never written."""
    if row is None:
        return SwitchRecord(SwitchState())
    return _from_row(
        SwitchRecord,
        row,
        convert={"actuator_errors": lambda errors: dict(errors or {})},
        state=_from_row(SwitchState, row, convert=_STATE_FROM_COLUMNS),
    )


def _evidence(decisions: Iterable[GateDecision]) -> list[dict[str, Any]]:
    return [d.to_dict() for d in decisions]


def transition_audit_row(transition: Transition) -> SwitchAuditRow:
    return SwitchAuditRow(
        kind="transition",
        **_row_values(transition, SwitchAuditRow, convert={"evidence": _evidence}),
    )


def refusal_audit_row(
    state: SwitchState, at: datetime, actor: str, reason: str, evidence: Iterable[GateDecision]
) -> SwitchAuditRow:
    """A human command refused while the switch was in `state`: the mode stays as it is."""
    return SwitchAuditRow(
        at=at,
        kind="refused",
        generation=state.generation,
        previous=state.mode.value,
        target=state.mode.value,
        control=state.control.value,
        actor=actor,
        reason=reason,
        evidence=_evidence(evidence),
    )


def audit_entry(row: SwitchAuditRow) -> AuditEntry:
    return _from_row(AuditEntry, row, convert={"evidence": list})


def gate_decision_rows(
    evaluation: Evaluation, comparison_arm: str | None = None
) -> list[GateDecisionRow]:
    """A row per gate decision, all at `evaluation.at` (the rows sharing it and
    `comparison_arm` are one evaluation, whatever each decision's own `evaluated_at`)."""
    return [
        GateDecisionRow(
            evaluated_at=evaluation.at,
            comparison_arm=comparison_arm,
            gate=d.name,
            state=d.state.value,
            mode=d.mode.value,
            critical=d.critical,
            decision=d.to_dict(),
        )
        for d in evaluation.decisions
    ]


def drift_reference_values(
    category: str, stats: ReferenceStats, at: datetime, arms: str
) -> dict[str, Any]:
    """The `drift_references` row pinning `stats` for `category` under `arms` at `at`."""
    return {
        "arms": arms,
        "category": category,
        **_row_values(stats, DriftReferenceRow),
        "pinned_at": at,
    }


def reference_from_row(row: DriftReferenceRow) -> ReferenceStats:
    return _from_row(ReferenceStats, row)
