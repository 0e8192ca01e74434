"""`canaryd judge`: the one-shot pre-deploy judge. It runs pairs of a baseline and a
candidate (two OpenAI-compatible URLs, or the arms of `--config`) one after another until
the enforce gates decide or the budget (`--pairs`, `--max-minutes`; never more than
`DEFAULT_MAX_MINUTES` unless `--max-minutes` says so) runs out, stops early
on a decision, stores everything as a run of kind `judge` (`canaryd report --run ID` draws
it) and exits 0 on PASS, 1 on FAIL, 3 (or `--undecided-exit`) on INCONCLUSIVE or NODATA,
and 2 on a configuration or infrastructure problem, as every command does. The gates and
the verdict are the daemon's (`gates.cycle.judge`); drift,
which watches one arm against its own pinned past, is judged only where this database
holds references for these arms. With `[telemetry]` in `--config`, both arms' production
telemetry is scraped from the start of the run (`canaryd.telemetry.recorder`, kept in
memory, not stored) and the telemetry gates judge it beside the pairs."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from canaryd.cli.common import fail, handle_errors, load_arms, progress_bar
from canaryd.cli.options import (
    BaselineOption,
    CandidateOption,
    ConfigOption,
    ModelOption,
    ServerKindOption,
    settings_with_urls,
)
from canaryd.config import load_settings
from canaryd.daemon.quarantine import storable
from canaryd.judging.calibration import note_tie_margin, tie_margin_for
from canaryd.judging.evidence import acceptance_reference
from canaryd.judging.verdict import finite
from canaryd.logs import configure_logging
from canaryd.pairs.plan import (
    arm_key,
    configured_suites,
    new_run,
    pair_runner,
    suite_sampler,
)
from canaryd.scoring import load_metrics
from canaryd.store import SqlStore
from canaryd.telemetry.recorder import TelemetryRecorder
from engine.base import Engine
from gates import GateDecision, GateMode
from gates.cycle import Verdict
from gates.cycle import judge as judge_window
from gates.records import PairRecord

__all__ = ["EXIT_CODES", "judge"]

EXIT_CODES: dict[Verdict, int] = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3, "NODATA": 3}
DEFAULT_PAIRS = 200
# Without --max-minutes the run still ends: 200 pairs of two 120 s timeouts each could
# otherwise take 13 hours. An hour is several times what a healthy pair of servers needs.
DEFAULT_MAX_MINUTES = 60.0


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _table(decisions: list[GateDecision], run_id: str) -> Table:
    table = Table(title=f"canaryd judge — run {run_id}", title_justify="left")
    for column in ("gate", "state", "mode", "statistic", "estimate", "bounds", "threshold", "n"):
        table.add_column(column, justify="left" if column in ("gate", "statistic") else "right")
    for d in decisions:
        table.add_row(
            d.name,
            d.state.value,
            d.mode.value,
            d.statistic or "-",
            _number(d.estimate),
            f"[{_number(d.lower)}, {_number(d.upper)}]",
            _number(d.threshold),
            f"{d.n_baseline}/{d.n_speculative}",
        )
    return table


@handle_errors
def judge(
    baseline: BaselineOption = None,
    candidate: CandidateOption = None,
    model: ModelOption = "default",
    server_kind: ServerKindOption = "generic",
    pairs: Annotated[
        int | None,
        typer.Option(
            "--pairs", "-n", min=1, help=f"at most this many pairs (default {DEFAULT_PAIRS})"
        ),
    ] = None,
    max_minutes: Annotated[
        float | None,
        typer.Option(
            "--max-minutes",
            min=0.01,
            help="at most this long, with no pair limit (instead of --pairs); without it, "
            f"at most {DEFAULT_MAX_MINUTES:g} minutes whatever --pairs says (the pair running "
            "then finishes)",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the verdict as JSON")] = False,
    undecided_exit: Annotated[
        int,
        typer.Option(
            "--undecided-exit",
            min=0,
            max=255,
            help="exit code for INCONCLUSIVE or NODATA (1 for job runners without 'undecided')",
        ),
    ] = 3,
    config: ConfigOption = None,
) -> None:
    """Judge a candidate against a baseline now: exit 0 PASS, 1 FAIL, 3 undecided, 2 error."""
    if pairs is not None and max_minutes is not None:
        raise fail("give --pairs or --max-minutes, not both")
    configure_logging(level="WARNING")
    settings = settings_with_urls(load_settings(config), baseline, candidate, model, server_kind)
    budget = pairs if pairs is not None else (None if max_minutes is not None else DEFAULT_PAIRS)
    suites = configured_suites(settings)
    sampler = suite_sampler(settings, None, suites)
    arm = settings.switch_arm
    err = Console(stderr=True)
    store = SqlStore.open(settings.storage.resolved_url(), create=True)
    engines: dict[str, Engine] = {}
    recorder: TelemetryRecorder | None = None
    try:
        references = store.drift_references(arm_key(settings, arm))
        gates = settings.gates
        if not references:  # nothing to drift from: drift would stay NODATA for ever
            gates = gates.model_copy(
                update={"drift": gates.drift.model_copy(update={"mode": GateMode.DRY_RUN})}
            )
        gates, margin = tie_margin_for(store, settings, arm, gates)
        load_metrics()  # scoring's imports, before the clock of the time to a decision
        engines = load_arms(settings, err)
        if settings.telemetry.enabled:
            recorder = TelemetryRecorder(settings.telemetry, str(config or "[telemetry]"))
            recorder.start()
        minutes = DEFAULT_MAX_MINUTES if max_minutes is None else max_minutes
        budget_config = {"judge": {"pairs": budget, "max_minutes": minutes}}
        run = new_run(settings, "judge", engines, extra_config=budget_config)
        store.create_run(run)
        runner = pair_runner(settings, engines, run.run_id)
        started = time.monotonic()
        deadline = started + 60 * minutes
        records: list[PairRecord] = []
        decisions: list[GateDecision] = []
        verdict: Verdict = "NODATA"
        reason = "no pair was run"
        decided_after_s: float | None = None
        with progress_bar(err, 12) as progress:
            task = progress.add_task("pairs", total=budget)
            while (budget is None or len(records) < budget) and time.monotonic() < deadline:
                group = runner.run_group(sampler.next())
                for record in group.records:
                    store.save_pair(storable(record)[0])
                records.append(group.record(arm))
                now = datetime.now(UTC)
                telemetry = recorder.evidence(arm) if recorder is not None else None
                judged = judge_window(
                    records,
                    references,
                    None,
                    gates,
                    now,
                    telemetry=telemetry,
                    scrape_interval_s=settings.telemetry.scrape_interval_s,
                    acceptance_reference=acceptance_reference(telemetry, gates, now),
                    subject=f"judge run {run.run_id}",
                )
                decisions = list(note_tie_margin(judged.decisions, margin))
                verdict, reason = judged.verdict, judged.reason
                progress.update(task, advance=1, description=verdict)
                if verdict in ("PASS", "FAIL"):
                    decided_after_s = time.monotonic() - started
                    break
        store.finish_run(run.run_id, datetime.now(UTC))
    finally:
        if recorder is not None:
            recorder.close()
        for engine in engines.values():
            engine.close()
        store.close()
    elapsed = time.monotonic() - started
    if as_json:
        body: dict[str, Any] = {
            "run_id": run.run_id,
            "verdict": verdict,
            "reason": reason,
            "pairs": len(records),
            "elapsed_s": round(elapsed, 3),
            "decided_after_s": None if decided_after_s is None else round(decided_after_s, 3),
            "drift_judged": bool(references),
            "gates": [d.to_dict() for d in decisions],
        }
        json.dump(finite(body), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        out = Console() if Console().is_terminal else Console(width=160)
        out.print(_table(decisions, run.run_id))
        out.print(f"verdict: {verdict} — {reason}", highlight=False)
        decided = (
            f"decided after {decided_after_s:.1f} s"
            if decided_after_s is not None
            else "not decided within the budget"
        )
        out.print(
            f"{len(records)} pairs in {elapsed:.1f} s, {decided}; "
            f"`canaryd report --run {run.run_id}` draws them",
            highlight=False,
        )
        if not references:
            out.print(
                "drift not judged: this database holds no acceptance reference for these arms "
                "(the daemon pins one from healthy traffic)",
                highlight=False,
            )
    code = EXIT_CODES[verdict] if verdict in ("PASS", "FAIL") else undecided_exit
    raise typer.Exit(code)
