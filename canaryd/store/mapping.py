"""Records <-> rows: how the history the store keeps becomes its rows, and back.

This module owns the mapping between the history's records (`RunInfo`, `PairRecord` with
its `Prompt`, `GenerationResult`s and `PairScores`; `PairFacts` and `PairRollup`) and the
ORM models of `canaryd.store.models`. A record field stored in a column of the same name
is mapped generically (`canaryd.store.columns`: enums by value, tuples as JSON lists);
only fields that genuinely differ (a nested record, a renamed column, JSON with its own
shape) are spelled out. The switch's rows (its state, audit entries, gate decisions,
drift references) are mapped in `canaryd.store.switching_mapping`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from types import MappingProxyType
from typing import Any, cast

from sqlalchemy import Select, and_, select
from sqlalchemy.orm import aliased

from canaryd.store.abc import StoredRun
from canaryd.store.columns import Convert, column_value, from_row, row_values
from canaryd.store.models import (
    GenerationRow,
    PairRollupRow,
    PairRow,
    PairScoresRow,
    PromptRow,
    RunRow,
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
from engine.types import (
    AcceptanceSource,
    DraftCost,
    ErrorKind,
    GenerationResult,
    InterTokenLatency,
    Message,
    Role,
    SpeculativeStats,
)
from gates.records import ARMS, Arm, Check, CheckKind, PairRecord, PairScores, Prompt, RunInfo

__all__ = [
    "facts_from_columns",
    "facts_query",
    "pair_from_row",
    "pair_row",
    "prompt_content_hash",
    "prompt_values",
    "rollup_from_row",
    "rollup_values",
    "run_from_row",
    "run_row",
]


# --- records <-> rows -----------------------------------------------------------------


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
        **row_values(
            prompt,
            PromptRow,
            renamed=_PROMPT_COLUMNS,
            convert={"messages": _messages_to_json, "check": _check_to_json},
        ),
    }


def _prompt_from_row(row: PromptRow) -> Prompt:
    return from_row(
        Prompt,
        row,
        renamed=_PROMPT_COLUMNS,
        convert={"messages": _messages_from_json, "check": _check_from_json},
    )


# `SpeculativeStats` is stored flat in its generation's row; all NULL when not reported.
_SPECULATIVE_COLUMNS = MappingProxyType({"source": "speculative_source"})
_SPECULATIVE_FROM_COLUMNS: Mapping[str, Convert] = MappingProxyType(
    {
        "accepted_per_position": _tuple,
        "drafted_per_position": _tuple,
        "source": lambda value: AcceptanceSource(value or AcceptanceSource.DECODING_LOOP),
    }
)
# `InterTokenLatency` is stored flat, prefixed `itl_`; its arrivals are never stored.
_ITL_COLUMNS = MappingProxyType(
    {spec.name: f"itl_{spec.name}" for spec in fields(InterTokenLatency) if spec.name != "arrivals"}
)
_GENERATION_FROM_COLUMNS: Mapping[str, Convert] = MappingProxyType(
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
        speculative = row_values(stats, GenerationRow, renamed=_SPECULATIVE_COLUMNS)
    cost = result.draft_cost
    draft_cost = (
        {spec.name: None for spec in fields(DraftCost)}
        if cost is None
        else row_values(cost, GenerationRow)
    )
    itl = (
        dict.fromkeys(_ITL_COLUMNS.values())
        if result.itl is None
        else row_values(result.itl, GenerationRow, renamed=_ITL_COLUMNS)
    )
    return GenerationRow(
        arm=arm, **row_values(result, GenerationRow), **speculative, **draft_cost, **itl
    )


def _generation_from_row(row: GenerationRow) -> GenerationResult:
    stats = None
    if row.verify_steps is not None:
        stats = from_row(
            SpeculativeStats,
            row,
            renamed=_SPECULATIVE_COLUMNS,
            convert=_SPECULATIVE_FROM_COLUMNS,
        )
    cost = None if row.draft_s is None else from_row(DraftCost, row)
    itl = None if row.itl_tokens is None else from_row(InterTokenLatency, row, renamed=_ITL_COLUMNS)
    return from_row(
        GenerationResult,
        row,
        convert=_GENERATION_FROM_COLUMNS,
        speculative=stats,
        draft_cost=cost,
        itl=itl,
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
        **row_values(record, PairRow, renamed=_PAIR_COLUMNS),
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
            else PairScoresRow(**row_values(record.scores, PairScoresRow))
        ),
    )


def pair_from_row(row: PairRow) -> PairRecord:
    """The record stored as `row` with its prompt, generations and scores."""
    by_arm = {generation.arm: generation for generation in row.generations}
    return from_row(
        PairRecord,
        row,
        renamed=_PAIR_COLUMNS,
        convert={"arm_order": _arm_order},
        prompt=_prompt_from_row(row.prompt),
        baseline=_generation_from_row(by_arm["baseline"]),
        speculative=_generation_from_row(by_arm["speculative"]),
        scores=None if row.scores is None else from_row(PairScores, row.scores),
    )


def run_row(run: RunInfo) -> RunRow:
    """The `runs` row of a run just started."""
    return RunRow(**row_values(run, RunRow), finished_at=None)


def run_from_row(row: RunRow) -> StoredRun:
    return StoredRun(info=from_row(RunInfo, row), finished_at=row.finished_at)


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
                values[f"{spec.name}_{arm_spec.name}"] = column_value(getattr(value, arm_spec.name))
        else:
            values[spec.name] = column_value(value)
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
