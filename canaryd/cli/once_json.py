"""The JSON shape of pairs and summaries that `canaryd once --json` prints.

Documented in docs/once-json.md; scripts rely on it, so change it only additively.
A figure the engine did not report is `null`, never 0. One entry of `pairs` is one
prompt: the baseline, and under `arms` every speculative arm with its own scores against
that baseline; with exactly one speculative arm the entry also keeps the single-arm keys
(`speculative`, `speedup`, `scores`) it always had.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from canaryd.pairs.runner import PairGroup
from canaryd.report.summary import ALL, CategorySummary, summarise
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
        # the gaps between tokens (s): P50/P95/P99 and max; null under two tokens
        "itl": None
        if result.itl is None
        else {
            "p50_s": result.itl.p50_s,
            "p95_s": result.itl.p95_s,
            "p99_s": result.itl.p99_s,
            "max_s": result.itl.max_s,
        },
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
            "fallback_rate": stats.fallback_rate if stats else None,
        }
        cost = result.draft_cost
        data |= {  # null unless the engine timed its own drafting
            "draft_s": cost.draft_s if cost else None,
            "verify_s": cost.verify_s if cost else None,
            "draft_share": cost.draft_share if cost else None,
            "tree_tokens": cost.tree_tokens if cost else None,
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


def arm_entry_json(record: PairRecord) -> dict[str, Any]:
    """One speculative arm of a prompt: its generation, speedup and scores against the
    baseline, and the id it is stored under."""
    return {
        "pair_id": record.pair_id,
        **arm_json(record.speculative, speculative=True),
        "speedup": record.speedup,
        "scores": asdict(record.scores) if record.scores else None,
    }


def group_json(group: PairGroup) -> dict[str, Any]:
    """One prompt on the baseline and every speculative arm."""
    arms = {record.arm: arm_entry_json(record) for record in group.records}
    if len(group.records) == 1:
        return {**pair_json(group.records[0]), "group_id": group.group_id, "arms": arms}
    first = group.records[0]
    return {
        "pair_id": group.group_id,
        "group_id": group.group_id,
        "prompt_id": first.prompt.id,
        "category": first.prompt.category,
        "started_at": first.started_at.isoformat(),
        "arm_order": list(group.order),
        "seed": first.sampling_seed,
        "baseline": arm_json(group.baseline, speculative=False),
        "arms": arms,
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


RATIO_FIGURES = ("acceptance_length_mean", "speedup_median", "speculative_tokens_per_s")


def arm_ratios(
    by_arm: dict[str, dict[str, CategorySummary]], switch_arm: str
) -> list[dict[str, Any]]:
    """The switch's arm against each comparison arm: its figure over theirs, per category
    and over all (null where either side lacks the figure)."""
    ours = by_arm[switch_arm]
    ratios = []
    for arm, theirs in by_arm.items():
        if arm == switch_arm:
            continue
        by_category = {
            category: {
                figure: _ratio(getattr(ours[category], figure), getattr(summary, figure))
                for figure in RATIO_FIGURES
            }
            for category, summary in theirs.items()
            if category in ours
        }
        ratios.append(
            {"arm": switch_arm, "over": arm, **by_category.get(ALL, {}), "by_category": by_category}
        )
    return ratios


def once_json(run_id: str, groups: list[PairGroup], switch_arm: str) -> dict[str, Any]:
    """The whole output: the switch arm's summary per category (as with one arm), every
    arm's under `summary.arms`, the ratios between arms, and every prompt's pair."""
    arms = groups[0].arms if groups else (switch_arm,)
    by_arm = {arm: summarise(group.record(arm) for group in groups) for arm in arms}
    summary: dict[str, Any] = {category: s.as_dict() for category, s in by_arm[switch_arm].items()}
    summary["arms"] = {
        arm: {category: s.as_dict() for category, s in summaries.items()}
        for arm, summaries in by_arm.items()
    }
    summary["ratios"] = arm_ratios(by_arm, switch_arm)
    return {
        "run_id": run_id,
        "switch_arm": switch_arm,
        "summary": summary,
        "pairs": [group_json(group) for group in groups],
    }
