"""`canaryd calibrate`: measure the tie margin on the deployment itself and store it with the
arms' key (canaryd.judging.calibration). Prompts run greedy at their full `max_tokens`
on the baseline twice (A/A) and on the baseline and the switch's arm (A/B); every
divergent token is judged by the baseline as the daemon judges it; the margin stored is a
tail bound on those margins (canaryd.scoring.calibrate). Exit 0 when a margin was
stored, 3 when too few divergences were seen to bound it (nothing stored: the
configured `gates.quality.tie_margin_nats` keeps judging), 2 on an error."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from canaryd import paths
from canaryd.cli.common import handle_errors, progress_bar
from canaryd.cli.options import ConfigOption
from canaryd.config import Settings, load_settings
from canaryd.judging.calibration import Calibration, aa_arm, calibrate
from canaryd.logs import configure_logging
from canaryd.pairs.plan import prompt_sampler, resolve_prompts
from canaryd.scoring.calibrate import TAIL_CONFIDENCE, TAIL_COVERAGE, TAIL_METHOD
from canaryd.store import SqlStore
from engine.base import Engine
from engine.registry import build_engine
from gates.records import BASELINE_ARM, Prompt

__all__ = ["EXIT_STORED", "EXIT_TOO_FEW", "calibrate_command", "calibration_json"]

EXIT_STORED = 0
EXIT_TOO_FEW = 3  # as `canaryd judge` undecided: nothing wrong, nothing concluded
DEFAULT_PROMPTS = 40


def distinct_prompts(settings: Settings, count: int) -> list[Prompt]:
    """`count` distinct prompts of the configured suites, drawn as the daemon draws them
    (stratified by category); fewer when the suites hold fewer. Greedy output is a
    function of the prompt: a prompt drawn twice would be the same measurement twice."""
    prompts = resolve_prompts(settings, None)
    sampler = prompt_sampler(settings, prompts)
    chosen: dict[str, Prompt] = {}
    for _ in range(20 * count):
        if len(chosen) >= min(count, len(prompts)):
            break
        prompt = sampler.next()
        chosen.setdefault(prompt.id, prompt)
    return list(chosen.values())


def _load(settings: Settings, arm: str, console: Console) -> dict[str, Engine]:
    engines = {
        name: build_engine(settings.arms.arm(name), models_dir=paths.models_dir())
        for name in dict.fromkeys((BASELINE_ARM, aa_arm(settings), arm))
    }
    with console.status("loading and warming up engines…", spinner="dots"):
        for engine in engines.values():
            engine.load()
    return engines


def calibration_json(result: Calibration, stored: bool, configured: float) -> dict[str, Any]:
    """What `--json` prints."""
    return {
        "arm": result.arm,
        "arms": result.arms,
        "aa_arm": result.aa_arm,
        "prompts": result.prompts,
        "pairs": result.pairs,
        "failures": result.failures,
        "divergences": {
            "aa": len(result.aa_margins),
            "ab": len(result.ab_margins),
            "unmeasured": result.unmeasured,
            "needed": result.needed,
        },
        "max_margin": {
            "aa": max(result.aa_margins, default=None),
            "ab": max(result.ab_margins, default=None),
        },
        "coverage": TAIL_COVERAGE,
        "confidence": TAIL_CONFIDENCE,
        "method": TAIL_METHOD,
        "bound": result.bound,
        "stored": stored,
        "configured_margin": configured,
        "calibrated_at": result.at.isoformat(),
    }


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _table(body: dict[str, Any]) -> Table:
    table = Table(title=f"canaryd calibrate — arm {body['arm']}", title_justify="left")
    for column in ("pairs", "divergences", "max margin (nats)"):
        table.add_column(column, justify="right")
    table.add_column("", justify="left")
    divergences, maxima = body["divergences"], body["max_margin"]
    again = "twice" if body["aa_arm"] == BASELINE_ARM else f"and control arm {body['aa_arm']}"
    table.add_row(
        str(body["prompts"]),
        str(divergences["aa"]),
        _number(maxima["aa"]),
        f"A/A (baseline {again})",
    )
    table.add_row(
        str(body["prompts"]), str(divergences["ab"]), _number(maxima["ab"]), "A/B (speculative)"
    )
    return table


@handle_errors
def calibrate_command(
    config: ConfigOption = None,
    prompts: Annotated[
        int,
        typer.Option("--prompts", "-n", min=1, help="distinct prompts to run (each greedy, 3×)"),
    ] = DEFAULT_PROMPTS,
    as_json: Annotated[bool, typer.Option("--json", help="print the calibration as JSON")] = False,
) -> None:
    """Measure the arms' greedy tie margin and store it: exit 0 stored, 3 too few, 2 error."""
    configure_logging(level="WARNING")
    settings = load_settings(config)
    arm = settings.switch_arm
    chosen = distinct_prompts(settings, prompts)
    err = Console(stderr=True)
    store = SqlStore.open(settings.storage.resolved_url(), create=True)
    engines: dict[str, Engine] = {}
    try:
        engines = _load(settings, arm, err)
        with progress_bar(err, 8) as bar:
            task = bar.add_task("prompts", total=len(chosen))
            result = calibrate(settings, engines, arm, chosen, progress=lambda: bar.advance(task))
        row = result.stored()
        if row is not None:
            store.save_tie_margin(row)
    finally:
        for engine in engines.values():
            engine.close()
        store.close()
    body = calibration_json(result, row is not None, settings.gates.quality.tie_margin_nats)
    if as_json:
        json.dump(body, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        out = Console() if Console().is_terminal else Console(width=160)
        out.print(_table(body))
        out.print(
            f"bound: the smallest margin m with P(|margin| > m | divergence) ≤ "
            f"{1 - TAIL_COVERAGE:.1%} at {TAIL_CONFIDENCE:.0%} confidence — {TAIL_METHOD}",
            highlight=False,
        )
        if row is not None:
            out.print(
                f"stored: {row.margin:.4g} nats for arms {row.arms} (from {row.divergences} "
                f"divergences; configured {body['configured_margin']:g}); the quality gate "
                "uses it for these arms until their configuration changes",
                highlight=False,
            )
        else:
            out.print(
                f"not stored: {result.divergences} divergences measured, {result.needed} "
                f"needed for the bound ({result.unmeasured} unmeasured); the configured "
                f"{body['configured_margin']:g} nats keeps judging. Run more prompts.",
                highlight=False,
            )
    raise typer.Exit(EXIT_STORED if row is not None else EXIT_TOO_FEW)
