"""`canaryd probe`: capability parity between the baseline and the speculative arm. It runs
the checklist of `canaryd.parity` on both servers (two OpenAI-compatible URLs, or the arms
of `--config`), prints capability × arm with pass, fail or unsupported and the reason,
stores the table as a run of kind `probe` (`canaryd report --run ID` draws it) and exits
0 when the speculative arm passes everything the baseline passes, 1 when it regresses on
any capability, and 2 on a configuration or infrastructure problem. The whole run ends
by `--timeout`, every answer within its byte cap; answers a cap cut short fail their
capability with the cap as reason and are counted in the output (`read_caps`). A run the
deadline cut before every capability ran shows no parity: exit 2 unless it regressed."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from canaryd.cli.common import handle_errors, progress_bar
from canaryd.cli.options import (
    BaselineOption,
    CandidateOption,
    ConfigOption,
    ModelOption,
    ServerKindOption,
    settings_with_urls,
)
from canaryd.config import load_settings
from canaryd.logs import configure_logging
from canaryd.pairs.plan import build_arms, new_run
from canaryd.parity.checks import CAPABILITIES, Outcome
from canaryd.parity.report import ProbeReport
from canaryd.parity.run import PROBE_TIMEOUT_S, probe_arms, run_probe
from canaryd.store import SqlStore

__all__ = ["probe", "probe_table"]

_STYLE = {"pass": "green", "fail": "bold red", "unsupported": "yellow"}


def probe_table(report: ProbeReport, run_id: str) -> Table:
    table = Table(title=f"canaryd probe — run {run_id}", title_justify="left", show_lines=True)
    for column in ("capability", "baseline", f"speculative ({report.arm})", "regression"):
        table.add_column(column, overflow="fold")

    def cell(outcome: Outcome) -> str:
        return f"[{_STYLE[outcome.state]}]{outcome.state}[/] {outcome.reason}"

    for capability in report.capabilities:
        table.add_row(
            capability.name,
            cell(capability.baseline),
            cell(capability.speculative),
            "[bold red]yes[/]" if capability.regressed else "",
        )
    return table


@handle_errors
def probe(
    baseline: BaselineOption = None,
    candidate: CandidateOption = None,
    model: ModelOption = "default",
    server_kind: ServerKindOption = "generic",
    as_json: Annotated[bool, typer.Option("--json", help="print the table as JSON")] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=1.0,
            max=3600.0,
            help="seconds the whole probe may take: answers still arriving then are cut, "
            "capabilities not started fail as not run",
        ),
    ] = PROBE_TIMEOUT_S,
    config: ConfigOption = None,
) -> None:
    """Probe what the speculative arm still supports: exit 0 parity, 1 regression, 2 error
    (or a run --timeout cut short)."""
    configure_logging(level="WARNING")
    settings = settings_with_urls(load_settings(config), baseline, candidate, model, server_kind)
    probe_arms(settings)  # refuse in-process arms before building anything
    engines = {
        name: engine
        for name, engine in build_arms(settings).items()
        if name in ("baseline", settings.switch_arm)
    }
    err = Console(stderr=True)
    started_at = datetime.now(UTC)
    try:
        for engine in engines.values():
            engine.load()
        with progress_bar(err, 24) as progress:
            task = progress.add_task("probe", total=2 * len(CAPABILITIES))

            def advance(capability: str, arm: str, outcome: Outcome) -> None:
                progress.update(task, advance=1, description=f"{capability} {outcome.state}")

            report = run_probe(settings, engines, on_result=advance, timeout_s=timeout)
    finally:
        for engine in engines.values():
            engine.close()
    run = new_run(
        settings, "probe", engines, started_at=started_at, extra_config={"probe": report.to_dict()}
    )
    store = SqlStore.open(settings.storage.resolved_url(), create=True)
    try:
        store.create_run(run)
        store.finish_run(run.run_id, datetime.now(UTC))
    finally:
        store.close()
    regressions = report.regressions
    if as_json:
        json.dump({"run_id": run.run_id, **report.to_dict()}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        out = Console() if Console().is_terminal else Console(width=160)
        out.print(probe_table(report, run.run_id))
        verdict = (
            f"REGRESSION on {', '.join(regressions)}"
            if regressions
            else f"INCOMPLETE: the deadline passed before {', '.join(report.not_run)} ran"
            if report.not_run
            else "parity: the speculative arm passes everything the baseline passes"
        )
        out.print(
            f"{verdict}; {report.elapsed_s:.1f} s; `canaryd report --run {run.run_id}` draws it",
            highlight=False,
        )
        if report.read_caps:
            cut = ", ".join(f"{what} {n}" for what, n in report.read_caps.items())
            out.print(f"answers cut short by a read cap: {cut}", highlight=False)
    raise typer.Exit(1 if regressions else 2 if report.not_run else 0)
