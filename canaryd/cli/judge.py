"""`canaryd judge`: the one-shot pre-deploy judge. It runs pairs of a baseline and a
candidate (two OpenAI-compatible URLs, or the arms of `--config`) one after another until
the enforce gates decide or the budget (`--pairs`, `--max-minutes`; never more than
`DEFAULT_MAX_MINUTES` unless `--max-minutes` says so) runs out, stops early
on a decision, stores everything as a run of kind `judge` (`canaryd report --run ID` draws
it) and exits 0 on PASS, 1 on FAIL, 3 (or `--undecided-exit`) on INCONCLUSIVE or NODATA,
and 2 on a configuration or infrastructure problem, as every command does. The run itself
is `canaryd.judging.oneshot.judge_candidate` (the gates and the verdict are the daemon's,
`gates.cycle.judge`; drift only where this database holds references for these arms;
with `[telemetry]` in `--config`, both arms' production telemetry beside the pairs); this
module parses the options, shows the progress and prints the outcome."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
from canaryd.judging.oneshot import Progress, judge_candidate
from canaryd.judging.verdict import finite
from canaryd.logs import configure_logging
from gates import GateDecision
from gates.cycle import Verdict

__all__ = ["EXIT_CODES", "judge"]

EXIT_CODES: dict[Verdict, int] = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3, "NODATA": 3}
DEFAULT_PAIRS = 200
# Without --max-minutes the run still ends: 200 pairs of two 120 s timeouts each could
# otherwise take 13 hours. An hour is several times what a healthy pair of servers needs.
DEFAULT_MAX_MINUTES = 60.0


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _table(decisions: Sequence[GateDecision], run_id: str) -> Table:
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


def _progress(console: Console) -> Progress:
    """A bar of the pairs on `console`, advanced with each pair's verdict."""

    @contextmanager
    def bar(budget: int | None) -> Iterator[Callable[[Verdict], None]]:
        with progress_bar(console, 12) as progress:
            task = progress.add_task("pairs", total=budget)
            yield lambda verdict: progress.update(task, advance=1, description=verdict)

    return bar


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
    err = Console(stderr=True)
    outcome = judge_candidate(
        settings,
        pairs=budget,
        minutes=DEFAULT_MAX_MINUTES if max_minutes is None else max_minutes,
        load_engines=lambda loaded: load_arms(loaded, err),
        telemetry_origin=str(config or "[telemetry]"),
        progress=_progress(err),
    )
    verdict, decided_after_s = outcome.verdict, outcome.decided_after_s
    if as_json:
        body: dict[str, Any] = {
            "run_id": outcome.run_id,
            "verdict": verdict,
            "reason": outcome.reason,
            "pairs": outcome.pairs,
            "elapsed_s": round(outcome.elapsed_s, 3),
            "decided_after_s": None if decided_after_s is None else round(decided_after_s, 3),
            "drift_judged": outcome.drift_judged,
            "gates": [d.to_dict() for d in outcome.decisions],
        }
        json.dump(finite(body), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        out = Console() if Console().is_terminal else Console(width=160)
        out.print(_table(outcome.decisions, outcome.run_id))
        out.print(f"verdict: {verdict} — {outcome.reason}", highlight=False)
        decided = (
            f"decided after {decided_after_s:.1f} s"
            if decided_after_s is not None
            else "not decided within the budget"
        )
        out.print(
            f"{outcome.pairs} pairs in {outcome.elapsed_s:.1f} s, {decided}; "
            f"`canaryd report --run {outcome.run_id}` draws them",
            highlight=False,
        )
        if not outcome.drift_judged:
            out.print(
                "drift not judged: this database holds no acceptance reference for these arms "
                "(the daemon pins one from healthy traffic)",
                highlight=False,
            )
    code = EXIT_CODES[verdict] if verdict in ("PASS", "FAIL") else undecided_exit
    raise typer.Exit(code)
