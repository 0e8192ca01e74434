"""`canaryd once`: run N pairs now, store them, print a per-category table (one per
speculative arm, with the ratios between arms) or JSON."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from canaryd.cli.common import handle_errors, load_arms
from canaryd.cli.once_json import RATIO_FIGURES, once_json
from canaryd.cli.options import ConfigOption
from canaryd.config import load_settings
from canaryd.logs import configure_logging
from canaryd.pairs.plan import (
    configured_suites,
    new_run,
    pair_runner,
    suite_sampler,
)
from canaryd.pairs.runner import PairGroup
from canaryd.report import ALL, CategorySummary, summarise
from canaryd.store import SqlStore
from canaryd.store.text import storable


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def summary_table(summary: dict[str, CategorySummary], run_id: str, arm: str = "") -> Table:
    title = f"canaryd once — run {run_id}" + (f" — arm {arm}" if arm else "")
    table = Table(title=title, title_justify="left")
    for column in (
        "category",
        "pairs",
        "speedup p50",
        "accept len mean",
        "p50",
        "p90",
        "fallback",
        "exact match",
        "quality Δ",
        "base e2e p50/p99 s",
        "spec e2e p50/p99 s",
        "ITL p99 b/s",
        "errors b/s",
    ):
        table.add_column(column, justify="left" if column == "category" else "right")
    for category, s in summary.items():
        table.add_row(
            f"[bold]{category}[/]" if category == ALL else category,
            str(s.pairs),
            _fmt(s.speedup_median, ".2f", "×"),
            _fmt(s.acceptance_length_mean),
            _fmt(s.acceptance_length_p50),
            _fmt(s.acceptance_length_p90),
            _fmt(None if s.fallback_rate is None else s.fallback_rate * 100, ".0f", "%"),
            _fmt(None if s.exact_match_rate is None else s.exact_match_rate * 100, ".0f", "%"),
            _fmt(s.quality_delta_mean, "+.2f"),
            f"{_fmt(s.baseline_e2e_p50_s)}/{_fmt(s.baseline_e2e_p99_s)}",
            f"{_fmt(s.speculative_e2e_p50_s)}/{_fmt(s.speculative_e2e_p99_s)}",
            f"{_fmt(s.baseline_itl_p99_s, '.3f')}/{_fmt(s.speculative_itl_p99_s, '.3f')}",
            f"{s.baseline_errors}/{s.speculative_errors}",
            end_section=category != ALL and ALL in summary and category == list(summary)[-2],
        )
    return table


def _listing(items: list[tuple[str, float]]) -> str:
    return ", ".join(f"{category} ({speedup:.2f}×)" for category, speedup in items)


def verdict_sentences(summary: dict[str, CategorySummary]) -> list[str]:
    """Plain sentences under the table: where speculation paid off on these pairs, where
    it did not, and that the daemon's gates judge the same figures continuously.

    A speedup is baseline end-to-end time over speculative end-to-end time, median over
    the category's pairs: above 1 the speculative arm was faster."""
    categories = [(c, s) for c, s in summary.items() if c != ALL]
    measured = [(c, s.speedup_median) for c, s in categories if s.speedup_median is not None]
    paid = [(c, speedup) for c, speedup in measured if speedup > 1.0]
    slower = [(c, speedup) for c, speedup in measured if speedup <= 1.0]
    total = summary.get(ALL)
    pairs = total.pairs if total is not None else sum(s.pairs for _, s in categories)
    lines = []
    if paid:
        lines.append(f"Speculation paid off on these pairs in {_listing(paid)}.")
    if slower:
        lines.append(
            f"It did not in {_listing(slower)}: there the speculative arm was no faster than "
            "the baseline (below 1× it was slower); on open-ended prompts and on a CPU, "
            "drafting often costs more than it saves."
        )
    if not paid and not slower:
        lines.append("No pair completed on both arms, so there is no speedup to report.")
    errors = [(c, s) for c, s in categories if s.speculative_errors > s.baseline_errors]
    if errors:
        lines.append(
            "The speculative arm failed more often than the baseline in "
            + ", ".join(f"{c} ({s.speculative_errors} vs {s.baseline_errors})" for c, s in errors)
            + "."
        )
    if total is not None and total.exact_match_rate is not None and total.exact_match_rate < 1:
        lines.append(
            f"Greedy outputs matched in {total.exact_match_rate:.0%} of pairs; the quality "
            "gate decides whether the differences are real divergences."
        )
    lines.append(
        f"These are {pairs} pair(s), a first look: `canaryd run` measures the same figures "
        "continuously and its gates decide, with confidence bounds, whether speculation "
        "stays on (docs/gates.md)."
    )
    return lines


@handle_errors
def once(
    config: ConfigOption = None,
    pairs: Annotated[int, typer.Option("--pairs", "-n", min=1, help="pairs to run")] = 12,
    category: Annotated[str | None, typer.Option(help="only prompts of this category")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (docs/once-json.md)")] = False,
) -> None:
    """Run N baseline-vs-speculative pairs now, store them, and print a summary."""
    configure_logging(level="WARNING" if as_json else "INFO")
    settings = load_settings(config)
    suites = configured_suites(settings)
    sampler = suite_sampler(settings, category, suites)
    store = SqlStore.open(settings.storage.resolved_url(), create=True)
    err = Console(stderr=True)
    try:
        for suite in suites:
            store.record_suite(suite.name, suite.sha256, str(suite.path))
        engines = load_arms(settings, err)
        run = new_run(settings, "once", engines)
        store.create_run(run)
        runner = pair_runner(settings, engines, run.run_id)
        groups: list[PairGroup] = []
        with Progress(
            TextColumn("pairs"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
            disable=not err.is_terminal,
        ) as progress:
            task = progress.add_task("", total=pairs)
            for prompt in sampler.take(pairs):
                progress.update(task, description=prompt.category)
                group = runner.run_group(prompt)
                for record in group.records:
                    # As the daemon does: NUL in an output is replaced, not a lost pair.
                    store.save_pair(storable(record)[0])
                groups.append(group)
                progress.advance(task)
        store.finish_run(run.run_id, datetime.now(UTC))
    finally:
        store.close()
    output = once_json(run.run_id, groups, settings.switch_arm)
    if as_json:
        json.dump(output, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    out = Console()
    if not out.is_terminal:  # a pipe or a log: do not squeeze the table into 80 columns
        out = Console(width=160)
    arms = list(runner.speculative)
    if len(arms) == 1:
        summary = summarise(g.records[0] for g in groups)
        out.print(summary_table(summary, run.run_id))
        for line in verdict_sentences(summary):
            out.print(line, highlight=False)
        return
    for arm in arms:
        label = f"{arm} (switch)" if arm == settings.switch_arm else arm
        out.print(summary_table(summarise(g.record(arm) for g in groups), run.run_id, label))
    for ratio in output["summary"]["ratios"]:
        figures = ", ".join(f"{name} {_fmt(ratio[name], '.3f', '×')}" for name in RATIO_FIGURES)
        out.print(f"{ratio['arm']} over {ratio['over']} (all): {figures}")
    switch_summary = summarise(g.record(settings.switch_arm) for g in groups)
    out.print(f"Switch arm {settings.switch_arm}:", highlight=False)
    for line in verdict_sentences(switch_summary):
        out.print(line, highlight=False)
