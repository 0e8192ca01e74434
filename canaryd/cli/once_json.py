"""The JSON shape of pairs and summaries that `canaryd once --json` prints.

Documented in docs/once-json.md; scripts rely on it, so change it only additively.
A figure the engine did not report is `null`, never 0.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from canaryd.report.summary import CategorySummary
from engine.types import GenerationResult
from gates.records import PairRecord


def _positions(counts: tuple[int, ...]) -> list[int] | None:
    """Per-position counts; an engine that does not report them gives an empty tuple."""
    return list(counts) if counts else None


def arm_json(result: GenerationResult, *, speculative: bool) -> dict[str, Any]:
    data: dict[str, Any] = {
        "ttft_s": result.ttft_s,
        "tpot_s": result.tpot_s,
        "e2e_s": result.e2e_s,
        "prompt_tokens": result.prompt_tokens,
        "output_tokens": result.output_tokens,
        "tokens_per_s": result.tokens_per_s,
        "finish_reason": result.finish_reason,
        "error": None if result.ok else result.error.value,
        "error_detail": result.error_detail or None,
        "http_status": result.http_status,
        "text": result.text,
    }
    if speculative:
        stats = result.speculative
        data |= {
            "acceptance_source": result.acceptance_source.value,
            "verify_steps": stats.verify_steps if stats else None,
            "draft_tokens": stats.draft_tokens if stats else None,
            "accepted_tokens": stats.accepted_tokens if stats else None,
            # Not reported (None, or an empty per-position tuple) is null, never 0 or [].
            "accepted_per_position": _positions(stats.accepted_per_position if stats else ()),
            "drafted_per_position": _positions(stats.drafted_per_position if stats else ()),
            "acceptance_length": result.acceptance_length,
            "acceptance_rate": stats.acceptance_rate if stats else None,
        }
    return data


def pair_json(record: PairRecord) -> dict[str, Any]:
    return {
        "pair_id": record.pair_id,
        "prompt_id": record.prompt.id,
        "category": record.prompt.category,
        "started_at": record.started_at.isoformat(),
        "arm_order": list(record.arm_order),
        "seed": record.sampling_seed,
        "speedup": record.speedup,
        "baseline": arm_json(record.baseline, speculative=False),
        "speculative": arm_json(record.speculative, speculative=True),
        "scores": asdict(record.scores) if record.scores else None,
    }


def once_json(
    run_id: str, summary: dict[str, CategorySummary], records: list[PairRecord]
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "summary": {category: s.as_dict() for category, s in summary.items()},
        "pairs": [pair_json(r) for r in records],
    }
