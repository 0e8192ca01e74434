"""Several speculative arms side by side: the figures, tables and plots of the ablation.

When a run sends every prompt to more than one speculative arm, each arm's pairs are
judged against the same baseline, and this module sets the arms next to each other:
acceptance length (mean, P50, P90, per category and per draft position), speedup,
P99, consistency and the draft side's share of decoding time, per arm. Every figure is
computed from stored `PairRecord`s (one per arm and prompt), by the same functions the
single-arm report uses, so an arm's row here equals what the report shows for that arm
alone. `canaryd report` and `canaryd bench` both draw from it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from canaryd.report.figures import (
    AcceptanceFigures,
    LevelFigures,
    acceptance_figures,
    acceptance_lengths,
)
from canaryd.report.plots import Plot, as_plot, new_figure
from canaryd.report.summary import ALL, summarise_group
from canaryd.report.tables import ReportTable, fmt, ladder_table, pct, positions, speedup_table
from gates import Evaluation
from gates.records import PairRecord
from gates.stats.descriptive import quantile, rate

__all__ = [
    "ArmFigures",
    "arm_category_table",
    "arm_figures",
    "arm_gates_table",
    "arm_ladder_tables",
    "arm_position_table",
    "arms_table",
    "pairs_by_arm",
    "plot_arm_acceptance",
    "plot_arm_positions",
]

_ARM_PALETTE = ("#DD8452", "#55A868", "#8172B2", "#C44E52", "#937860", "#DA8BC3", "#8C8C8C")


@dataclass(frozen=True, slots=True)
class ArmFigures:
    """One speculative arm against the baseline over all its pairs."""

    arm: str
    switch: bool  # the arm the rollback switch controls
    pairs: int
    complete_pairs: int
    acceptance: AcceptanceFigures
    speedup_median: float | None  # median over pairs of baseline e2e / this arm's e2e
    exact_match_rate: float | None
    speculative_e2e_p99_s: float | None
    baseline_e2e_p99_s: float | None
    speculative_tokens_per_s: float | None  # pooled output tokens / pooled e2e time
    # Drafting's share of decoding time, pooled over requests whose engine timed it.
    draft_share: float | None
    tree_tokens_per_step: float | None  # tokens the target verified per verify step


def pairs_by_arm(pairs: Iterable[PairRecord], arms: Sequence[str]) -> dict[str, list[PairRecord]]:
    """The pairs of each of `arms`, in `arms` order; pairs of other arms are left out."""
    grouped: dict[str, list[PairRecord]] = {arm: [] for arm in arms}
    for pair in pairs:
        if pair.arm in grouped:
            grouped[pair.arm].append(pair)
    return grouped


def _draft_cost(pairs: Sequence[PairRecord]) -> tuple[float | None, float | None]:
    costs = [
        (cost, stats)
        for p in pairs
        if p.complete
        and (cost := p.speculative.draft_cost) is not None
        and (stats := p.speculative.speculative) is not None
    ]
    drafting = sum(cost.draft_s for cost, _ in costs)
    total = drafting + sum(cost.verify_s for cost, _ in costs)
    steps = sum(stats.verify_steps for _, stats in costs)
    return (
        drafting / total if total > 0 else None,
        rate(sum(cost.tree_tokens for cost, _ in costs), steps),
    )


def arm_figures(by_arm: Mapping[str, Sequence[PairRecord]], switch_arm: str) -> list[ArmFigures]:
    """Each arm's figures, in `by_arm` order."""
    figures = []
    for arm, pairs in by_arm.items():
        summary = summarise_group(pairs)
        ok = [p.speculative.e2e_s for p in pairs if p.speculative.ok]
        base = [p.baseline.e2e_s for p in pairs if p.baseline.ok]
        share, width = _draft_cost(pairs)
        figures.append(
            ArmFigures(
                arm=arm,
                switch=arm == switch_arm,
                pairs=len(pairs),
                complete_pairs=summary.complete_pairs,
                acceptance=acceptance_figures(pairs),
                speedup_median=summary.speedup_median,
                exact_match_rate=summary.exact_match_rate,
                speculative_e2e_p99_s=quantile(ok, 0.99),
                baseline_e2e_p99_s=quantile(base, 0.99),
                speculative_tokens_per_s=summary.speculative_tokens_per_s,
                draft_share=share,
                tree_tokens_per_step=width,
            )
        )
    return figures


def arms_table(figures: Sequence[ArmFigures]) -> ReportTable:
    rows = tuple(
        (
            f"{f.arm} (switch)" if f.switch else f.arm,
            str(f.pairs),
            "/".join(
                fmt(x, ".2f")
                for x in (
                    f.acceptance.acceptance_length_mean,
                    f.acceptance.acceptance_length_p50,
                    f.acceptance.acceptance_length_p90,
                )
            ),
            pct(f.acceptance.acceptance_rate),
            fmt(f.speedup_median, ".3f", "×"),
            pct(f.exact_match_rate),
            f"{fmt(f.speculative_e2e_p99_s)}/{fmt(f.baseline_e2e_p99_s)}",
            fmt(f.speculative_tokens_per_s, ".1f"),
            pct(f.draft_share),
            fmt(f.tree_tokens_per_step, ".2f"),
        )
        for f in figures
    )
    return ReportTable(
        title="Speculative arms",
        columns=(
            "arm",
            "pairs",
            "accept len mean/p50/p90",
            "acceptance rate",
            "speedup p50",
            "exact match",
            "e2e p99 s arm/base",
            "arm tok/s",
            "draft share",
            "verified tok/step",
        ),
        rows=rows,
        note="every arm ran the same prompts with the same sampling as the one baseline; "
        "draft share: drafting time ÷ decoding time, pooled over requests whose engine "
        "times it (— where none does)",
    )


def arm_category_table(by_arm: Mapping[str, Sequence[PairRecord]]) -> ReportTable:
    """Per category: each arm's mean acceptance length and median speedup."""
    categories = sorted({p.prompt.category for pairs in by_arm.values() for p in pairs})
    rows = []
    for category in [*categories, ALL]:
        cells = [category]
        for pairs in by_arm.values():
            chosen = [p for p in pairs if category == ALL or p.prompt.category == category]
            summary = summarise_group(chosen)
            cells.append(
                f"{fmt(summary.acceptance_length_mean, '.2f')} / "
                f"{fmt(summary.speedup_median, '.2f', '×')}"
            )
        rows.append(tuple(cells))
    return ReportTable(
        title="Speculative arms by category",
        columns=("category", *(f"{arm}: accept len / speedup" for arm in by_arm)),
        rows=tuple(rows),
        note="mean acceptance length (tokens per verify step) / median speedup per arm",
    )


def arm_position_table(figures: Sequence[ArmFigures]) -> ReportTable:
    return ReportTable(
        title="Acceptance by draft position per arm",
        columns=("arm", "acceptance rate at position 1, 2, …"),
        rows=tuple((f.arm, positions(f.acceptance.acceptance_rate_per_position)) for f in figures),
        note="accepted ÷ drafted at each draft position (depth), pooled over requests that "
        "report both",
    )


def arm_ladder_tables(levels: Sequence[LevelFigures], arms: Sequence[str]) -> list[ReportTable]:
    """The ladder's speedup and per-level tables, one pair of tables per arm."""
    tables = []
    for arm in arms:
        mine = [level for level in levels if level.speculative_arm == arm]
        if mine:
            tables += [
                replace(speedup_table(mine), title=f"Speedup by concurrency — {arm}"),
                replace(ladder_table(mine), title=f"Concurrency ladder — {arm}"),
            ]
    return tables


def arm_gates_table(evaluations: Mapping[str, Evaluation | None]) -> ReportTable:
    """Each comparison arm's latest gate decisions (all in `warn`: never switching)."""
    rows = []
    for arm, evaluation in evaluations.items():
        if evaluation is None:
            rows.append((arm, "—", "no decision recorded", "", ""))
            continue
        at = evaluation.at.isoformat(timespec="seconds")
        rows += [(arm, d.name, d.state.value, d.mode.value, at) for d in evaluation.decisions]
    return ReportTable(
        title="Comparison arms: latest gate decisions",
        columns=("arm", "gate", "state", "mode", "evaluated at"),
        rows=tuple(rows),
        note="comparison arms are gated like the switch's arm, every gate in warn mode; "
        "their decisions never move the switch",
    )


def _colour(index: int) -> str:
    return _ARM_PALETTE[index % len(_ARM_PALETTE)]


def plot_arm_acceptance(by_arm: Mapping[str, Sequence[PairRecord]]) -> Plot:
    """Acceptance-length distributions per category, one box per arm side by side."""
    categories = sorted({p.prompt.category for pairs in by_arm.values() for p in pairs})
    groups = [*categories, ALL]
    arms = list(by_arm)
    figure = new_figure(figsize=(max(8.0, 0.9 * len(groups) * len(arms)), 4.0))
    axes = figure.add_subplot()
    width = 0.8 / max(len(arms), 1)
    for j, arm in enumerate(arms):
        data = [
            acceptance_lengths(
                p for p in by_arm[arm] if category == ALL or p.prompt.category == category
            )
            for category in groups
        ]
        at = [i + (j - (len(arms) - 1) / 2) * width for i in range(len(groups))]
        present = [(x, values) for x, values in zip(at, data, strict=True) if values]
        if not present:
            continue
        boxes = axes.boxplot(
            [values for _, values in present],
            positions=[x for x, _ in present],
            widths=width * 0.9,
            whis=(10, 90),
            showmeans=True,
            patch_artist=True,
        )
        for box in boxes["boxes"]:
            box.set_facecolor(_colour(j))
        axes.plot([], [], color=_colour(j), linewidth=6, label=arm)
    axes.set_xticks(range(len(groups)), groups, rotation=30)
    axes.set_ylabel("acceptance length (tokens / verify step)")
    axes.legend(fontsize=8)
    return as_plot(figure, "Acceptance length per arm and category")


def plot_arm_positions(figures: Sequence[ArmFigures]) -> Plot:
    """Acceptance rate by draft position (depth), one curve per arm."""
    figure = new_figure(figsize=(8, 3.6))
    axes = figure.add_subplot()
    for j, f in enumerate(figures):
        rates = f.acceptance.acceptance_rate_per_position
        if rates:
            axes.plot(
                range(1, len(rates) + 1),
                [math.nan if r is None else r for r in rates],
                marker="o",
                color=_colour(j),
                label=f.arm,
            )
    axes.set_xlabel("draft position (depth)")
    axes.set_ylabel("acceptance rate")
    axes.set_ylim(0, 1)
    axes.legend(fontsize=8)
    return as_plot(figure, "Acceptance by draft position per arm")
