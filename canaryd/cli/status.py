"""`canaryd status`: the canary's recent state from the history database.

The URL follows every command's rule (`StorageConfig.resolved_url`): `--url`, else the
configuration's `storage.url` (`--config` or CANARYD_CONFIG, CANARYD_STORAGE__URL), else
env CANARYD_DATABASE_URL, else the default SQLite file. Tables for a person, or with
`--json` the stable object documented in docs/storage.md; both name the daemon that
leads the gates (`canaryd.judging.leader`). An empty database is a message and exit 0; a bad
URL, unreachable server or missing schema is one line on stderr and exit 2.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from canaryd.cli.common import handle_errors
from canaryd.cli.options import ConfigOption, UrlOption, settings_and_url
from canaryd.judging.leader import Holder, leadership_for
from canaryd.report.status import ArmStatus, StatusReport, WindowStatus, build_status
from canaryd.store import SqlStore, mask_url
from gates.records import ARMS

EMPTY_MESSAGE = "no pairs recorded yet; start `canaryd run` or `canaryd once`"
_WINDOW_TITLES = {"last_hour": "last hour", "last_day": "last day"}


def _seconds(value: float | None, approximate: bool) -> str:
    if value is None:
        return "-"
    return f"{'~' if approximate else ''}{value:.3f}"


def _figure(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _itl(status: ArmStatus) -> str:
    """P50/P95/P99 in milliseconds: the median over generations of each one's own."""
    if status.itl_p99_s is None:
        return "-"
    quantiles = (status.itl_p50_s, status.itl_p95_s, status.itl_p99_s)
    return "/".join(_figure(None if v is None else v * 1000, ".1f") for v in quantiles)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _leader_line(leader: Holder | None) -> str:
    if leader is None:
        return "leader: none (no running daemon evaluates the gates on this database)"
    since = f", since {leader.since:%F %T %Z}" if leader.since else ""
    return f"leader: {leader.instance} (runs the gates and writes the switch{since})"


def _leader(url: str) -> Holder | None:
    leadership = leadership_for(url)
    try:
        return leadership.holder()
    finally:
        leadership.close()


def _render(report: StatusReport, console: Console) -> None:
    console.print(f"database: {report.database}")
    console.print(_leader_line(report.leader), highlight=False)
    last = report.last_pair_at
    console.print(
        f"last pair: {last.isoformat(timespec='seconds') if last else '-'} "
        f"({_age(report.last_pair_age_s)})"
    )
    run = report.latest_run
    if run is not None:
        state = "running" if run.finished_at is None else f"finished {run.finished_at:%F %T}"
        console.print(
            f"latest run: {run.info.run_id} ({run.info.kind}, started "
            f"{run.info.started_at:%F %T} UTC, {state}, config {run.info.config_hash})"
        )
    windows = list(report.windows.items())
    categories = sorted({c for _, w in windows for c in w.pairs_by_category})
    pairs = Table(title="pairs by category")
    pairs.add_column("category")
    for name, _ in windows:
        pairs.add_column(_WINDOW_TITLES.get(name, name), justify="right")
    for category in [*categories, "all"]:
        pairs.add_row(
            category,
            *(
                str(w.pairs if category == "all" else w.pairs_by_category.get(category, 0))
                for _, w in windows
            ),
        )
    console.print(pairs)
    figures = Table(
        title="arms (e2e seconds, ~ approximate, from hourly roll-ups; ITL ms, raw pairs)"
    )
    for column in ("window", "arm", "ok", "errors", "e2e p50", "e2e p99", "ITL p50/p95/p99"):
        figures.add_column(column, justify="left" if column in ("window", "arm") else "right")
    for name, window in windows:
        for arm in ARMS:
            status = window.arm(arm)
            errors = ", ".join(f"{kind} {n}" for kind, n in status.errors.items()) or "0"
            figures.add_row(
                _WINDOW_TITLES.get(name, name),
                arm,
                str(status.ok),
                errors,
                _seconds(status.e2e_p50_s, status.e2e_approximate),
                _seconds(status.e2e_p99_s, status.e2e_approximate),
                _itl(status),
            )
    console.print(figures)
    for name, window in windows:
        console.print(_quality_line(_WINDOW_TITLES.get(name, name), window))
    if len(report.arm_windows) > 1:
        console.print(_arms_table(report))
    if report.draft_lengths:
        console.print("draft length by category (last day's pairs):", highlight=False)
        for recommendation in report.draft_lengths.values():
            console.print(f"  {recommendation.summary()}", highlight=False, soft_wrap=True)


def _arms_table(report: StatusReport) -> Table:
    """Every speculative arm over each window (the tables above are the switch arm's)."""
    table = Table(title=f"speculative arms (the switch controls {report.switch_arm})")
    columns = ("window", "arm", "pairs", "accept len", "fallback", "exact match", "errors")
    for column in (*columns, "e2e p99", "ITL p50/p95/p99 ms"):
        table.add_column(column, justify="left" if column in ("window", "arm") else "right")
    for arm, windows in report.arm_windows.items():
        for name, window in windows.items():
            status = window.speculative
            table.add_row(
                _WINDOW_TITLES.get(name, name),
                f"{arm} (switch)" if arm == report.switch_arm else arm,
                str(window.pairs),
                _figure(window.acceptance_length_mean, ".2f"),
                _figure(window.fallback_rate, ".1%"),
                _figure(window.exact_match_rate, ".1%"),
                str(status.error_count),
                _seconds(status.e2e_p99_s, status.e2e_approximate),
                _itl(status),
            )
    return table


def _quality_line(title: str, window: WindowStatus) -> str:
    return (
        f"{title}: acceptance length mean {_figure(window.acceptance_length_mean, '.2f')}, "
        f"fallback rate {_figure(window.fallback_rate, '.1%')}, "
        f"exact match {_figure(window.exact_match_rate, '.1%')} "
        f"over {window.complete_pairs} complete pairs"
    )


@handle_errors
def status(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the stable JSON object instead of tables.")
    ] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Last cycle, pairs per category, per-arm P50/P99 and ITL, acceptance, fallback, errors."""
    _, resolved = settings_and_url(config, url)
    now = datetime.now(UTC)
    with SqlStore.open(resolved) as store:
        report = build_status(store, now, database=mask_url(resolved))
    report = replace(report, leader=_leader(resolved))
    if json_output:
        typer.echo(json.dumps(report.as_json(), indent=2, sort_keys=True))
        return
    if report.empty:
        typer.echo(f"{report.database}: {EMPTY_MESSAGE}")
        return
    _render(report, Console(width=120))
