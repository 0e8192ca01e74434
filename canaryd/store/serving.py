"""The serving figures of recent generations, as `canaryd status` reads them.

`ServingFacts` is what a generation row says about how it was served beyond its e2e: the
summary of its gaps between tokens (`itl_*` columns) and, for a speculative generation,
its verify steps and the steps that kept at least one draft token (the first entry of
acceptance per position), from which the fallback rate is pooled. `serving_query` reads
them for the pairs started in a window, newest first and bounded by a row limit, so a
busy history costs a status call at most that many small rows. Roll-ups keep neither
figure: only raw pairs contribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select

from canaryd.store.models import GenerationRow, PairRow
from engine.types import ErrorKind

__all__ = ["SERVING_ROW_LIMIT", "ServingFacts", "serving_from_columns", "serving_query"]

# Generations a status read takes at most: a day of pairs every 10 s on one speculative
# arm is 17,280 rows, so two arms fit.
SERVING_ROW_LIMIT = 40_000


@dataclass(frozen=True, slots=True)
class ServingFacts:
    """One generation's inter-token latency summary and fallback counts.

    `arm` is the pair's speculative arm, `role` which side of the pair this generation is
    (`baseline` or `speculative`). The ITL quantiles are None when the generation has no
    summary (it failed, or emitted fewer than two tokens); `kept_steps` (verify steps that
    kept at least one draft token) is None when the engine reported no acceptance per
    position, and then the generation says nothing of fallbacks."""

    started_at: datetime
    arm: str
    role: str
    ok: bool
    itl_p50_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    verify_steps: int | None
    kept_steps: int | None


_ServingRow = Select[
    datetime, str, str, str, float | None, float | None, float | None, int | None, list[int] | None
]


def serving_query(since: datetime, until: datetime, limit: int) -> _ServingRow:
    """Generations of the pairs started in [since, until), newest first, at most `limit`."""
    return (
        select(
            PairRow.started_at,
            PairRow.arm,
            GenerationRow.arm,
            GenerationRow.error,
            GenerationRow.itl_p50_s,
            GenerationRow.itl_p95_s,
            GenerationRow.itl_p99_s,
            GenerationRow.verify_steps,
            GenerationRow.accepted_per_position,
        )
        .join(PairRow, PairRow.pair_id == GenerationRow.pair_id)
        .where(PairRow.started_at >= since, PairRow.started_at < until)
        .order_by(PairRow.started_at.desc(), PairRow.pair_id.desc(), GenerationRow.arm)
        .limit(limit)
    )


def serving_from_columns(row: Sequence[Any]) -> ServingFacts:
    """The facts of one row of `serving_query`."""
    started_at, arm, role, error, p50, p95, p99, steps, per_position = row
    kept = int(per_position[0]) if per_position and steps else None
    return ServingFacts(
        started_at=started_at,
        arm=arm,
        role=role,
        ok=error == ErrorKind.NONE.value,
        itl_p50_s=p50,
        itl_p95_s=p95,
        itl_p99_s=p99,
        verify_steps=steps,
        kept_steps=kept,
    )
