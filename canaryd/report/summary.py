"""Per-category summaries of pair records: what `canaryd once` prints and returns, and
the report's category table.

The figures are computed here from records; the statistics themselves (quantiles) are
the gates package's, so a summary and a gate never disagree on what "P99" means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gates.records import PairRecord
from gates.stats.descriptive import mean, quantile, rate

ALL = "all"


@dataclass(frozen=True, slots=True)
class CategorySummary:
    pairs: int
    complete_pairs: int
    speedup_median: float | None  # median over pairs of baseline e2e / speculative e2e
    acceptance_length_mean: float | None  # 1 + accepted / verify steps, speculative arm
    acceptance_length_p50: float | None
    acceptance_length_p90: float | None
    # accepted / drafted tokens, pooled over pairs that report drafted tokens
    acceptance_rate: float | None
    # verify steps that kept no draft token / verify steps, pooled over pairs that report
    # acceptance per position
    fallback_rate: float | None
    exact_match_rate: float | None
    quality_delta_mean: float | None  # speculative - baseline task score
    baseline_e2e_p50_s: float | None
    baseline_e2e_p99_s: float | None
    speculative_e2e_p50_s: float | None
    speculative_e2e_p99_s: float | None
    # median over successful generations of each one's P99 gap between tokens
    baseline_itl_p99_s: float | None
    speculative_itl_p99_s: float | None
    baseline_tokens_per_s: float | None  # pooled output tokens / pooled e2e time
    speculative_tokens_per_s: float | None
    baseline_errors: int
    speculative_errors: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise_group(records: Sequence[PairRecord]) -> CategorySummary:
    complete = [r for r in records if r.complete]
    lengths = [x for r in complete if (x := r.speculative.acceptance_length) is not None]
    # Pooled over the pairs that report drafted tokens only: accepted tokens of a pair
    # without a drafted count would inflate the rate against a denominator it is not in.
    rated = [
        stats
        for r in complete
        if (stats := r.speculative.speculative) is not None and stats.draft_tokens is not None
    ]
    drafted = sum(stats.draft_tokens or 0 for stats in rated)
    accepted = sum(stats.accepted_tokens for stats in rated)
    scored = [r.scores for r in complete if r.scores is not None]
    deltas = [s.task_score_delta for s in scored if s.task_score_delta is not None]
    base_ok = [r.baseline for r in records if r.baseline.ok]
    spec_ok = [r.speculative for r in records if r.speculative.ok]

    stepped = [
        stats
        for r in complete
        if (stats := r.speculative.speculative) is not None and stats.fallback_rate is not None
    ]
    kept_steps = sum(stats.accepted_per_position[0] for stats in stepped)
    steps = sum(stats.verify_steps for stats in stepped)

    def itl_p99(results: Sequence[Any]) -> float | None:
        return quantile([g.itl.p99_s for g in results if g.itl is not None], 0.5)

    def throughput(results: Sequence[Any]) -> float | None:
        seconds = sum(g.e2e_s for g in results)
        return sum(g.output_tokens for g in results) / seconds if seconds > 0 else None

    return CategorySummary(
        pairs=len(records),
        complete_pairs=len(complete),
        speedup_median=quantile([s for r in complete if (s := r.speedup) is not None], 0.5),
        acceptance_length_mean=mean(lengths),
        acceptance_length_p50=quantile(lengths, 0.5),
        acceptance_length_p90=quantile(lengths, 0.9),
        acceptance_rate=rate(accepted, drafted),
        fallback_rate=rate(steps - kept_steps, steps),
        exact_match_rate=rate(sum(s.exact_match for s in scored), len(scored)),
        quality_delta_mean=mean(deltas),
        baseline_e2e_p50_s=quantile([g.e2e_s for g in base_ok], 0.5),
        baseline_e2e_p99_s=quantile([g.e2e_s for g in base_ok], 0.99),
        speculative_e2e_p50_s=quantile([g.e2e_s for g in spec_ok], 0.5),
        speculative_e2e_p99_s=quantile([g.e2e_s for g in spec_ok], 0.99),
        baseline_itl_p99_s=itl_p99(base_ok),
        speculative_itl_p99_s=itl_p99(spec_ok),
        baseline_tokens_per_s=throughput(base_ok),
        speculative_tokens_per_s=throughput(spec_ok),
        baseline_errors=sum(not r.baseline.ok for r in records),
        speculative_errors=sum(not r.speculative.ok for r in records),
    )


def summarise(records: Iterable[PairRecord]) -> dict[str, CategorySummary]:
    """One summary per category (sorted), plus `all` over every record."""
    records = list(records)
    categories = sorted({r.prompt.category for r in records})
    summary = {
        c: summarise_group([r for r in records if r.prompt.category == c]) for c in categories
    }
    if records:
        summary[ALL] = summarise_group(records)
    return summary
