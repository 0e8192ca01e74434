"""`canaryd calibrate`: measure the tie margin on the deployment itself and store it with the
arms' key (canaryd.judging.calibration). Prompts run greedy at their full `max_tokens`
on the baseline twice (A/A; the second run on the A/A control arm when one is
configured) and on the baseline and the switch's arm (A/B); every divergent token is
judged by the baseline as the daemon judges it; the margin stored is a tail bound on the
A/A pairs' margins, one per divergent pair (canaryd.scoring.calibrate). The A/B run is
shown, never used: the arm under test must not set the margin that judges it. Exit 0
when a margin was stored, 3 when too few A/A pairs diverged to bound it (nothing stored:
the configured `gates.quality.tie_margin_nats` keeps judging), 2 on an error."""

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
from canaryd.judging.calibration import (
    Calibration,
    RunDivergences,
    aa_arm,
    calibrate,
    expires_at,
)
from canaryd.logs import configure_logging
from canaryd.pairs.plan import prompt_sampler, resolve_prompts
from canaryd.scoring.calibrate import TAIL_CONFIDENCE, TAIL_COVERAGE, TAIL_METHOD, min_divergences
from canaryd.store import SqlStore, TieMargin
from engine.base import Engine
from engine.registry import build_engine
from gates.config import GatesConfig
from gates.records import BASELINE_ARM, Prompt

__all__ = ["EXIT_STORED", "EXIT_TOO_FEW", "calibrate_command", "calibration_json"]

EXIT_STORED = 0
EXIT_TOO_FEW = 3  # as `canaryd judge` undecided: nothing wrong, nothing concluded
# The bound needs 119 divergent A/A pairs of distinct prompts: ask for more prompts than
# the shipped suites hold (170), so that the default runs all of them.
DEFAULT_PROMPTS = 400


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


def _run_json(run: RunDivergences) -> dict[str, Any]:
    return {
        "arm": run.arm,
        "pairs": run.pairs,
        "divergent_pairs": run.divergent_pairs,
        "unmeasured": run.unmeasured,
        "tokens": len(run.token_margins),
        "max_margin": run.max_margin,
    }


def calibration_json(result: Calibration, stored: bool, gates: GatesConfig) -> dict[str, Any]:
    """What `--json` prints."""
    max_age = gates.quality.tie_margin_max_age_days
    return {
        "arm": result.arm,
        "arms": result.arms,
        "engines": result.engines,
        "prompts": result.prompts,
        "failures": result.failures,
        "aa": _run_json(result.aa),
        "ab": _run_json(result.ab),
        "needed": result.needed,
        "coverage": TAIL_COVERAGE,
        "confidence": TAIL_CONFIDENCE,
        "method": TAIL_METHOD,
        "bound": result.bound,
        "stored": stored,
        "not_stored": result.why_not_stored(),
        "configured_margin": gates.quality.tie_margin_nats,
        "max_age_days": max_age,
        "calibrated_at": result.at.isoformat(),
        "expires_at": expires_at(result.at, max_age).isoformat() if stored else None,
    }


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _table(body: dict[str, Any]) -> Table:
    table = Table(title=f"canaryd calibrate — arm {body['arm']}", title_justify="left")
    for column in ("pairs", "divergent pairs", "unmeasured", "tokens", "max margin (nats)"):
        table.add_column(column, justify="right")
    table.add_column("", justify="left")
    aa, ab = body["aa"], body["ab"]
    again = "twice" if aa["arm"] == BASELINE_ARM else f"and control arm {aa['arm']}"
    for run, label in (
        (aa, f"A/A (baseline {again}): sets the margin"),
        (ab, "A/B (speculative): information only"),
    ):
        table.add_row(
            str(run["pairs"]),
            str(run["divergent_pairs"]),
            str(run["unmeasured"]),
            str(run["tokens"]),
            _number(run["max_margin"]),
            label,
        )
    return table


def _print(body: dict[str, Any], row: TieMargin | None) -> None:
    out = Console() if Console().is_terminal else Console(width=160)
    out.print(_table(body))
    out.print(
        f"bound: the smallest margin m with P(pair margin > m | A/A divergence) ≤ "
        f"{1 - TAIL_COVERAGE:.1%} at {TAIL_CONFIDENCE:.0%} confidence, one margin per "
        f"divergent pair (its largest) — {TAIL_METHOD}",
        highlight=False,
    )
    if row is not None:
        out.print(
            f"stored: {row.margin:.4g} nats for arms {row.arms} (from {row.aa_divergent_pairs} "
            f"divergent A/A pairs; configured {body['configured_margin']:g}); the quality "
            f"gate uses it for these arms and engines until {body['expires_at']} "
            f"(gates.quality.tie_margin_max_age_days = {body['max_age_days']:g})",
            highlight=False,
        )
    else:
        out.print(
            f"not stored: {body['not_stored']}; the configured "
            f"{body['configured_margin']:g} nats keeps judging. Configure an A/A control arm "
            "on other hardware (gates.quality.control_arm), or run more distinct prompts "
            "(--prompts, prompts.suites).",
            highlight=False,
        )


@handle_errors
def calibrate_command(
    config: ConfigOption = None,
    prompts: Annotated[
        int,
        typer.Option(
            "--prompts",
            "-n",
            min=1,
            help="distinct prompts to run, each greedy 3× (at most the configured suites' "
            f"prompts); the bound needs {min_divergences()} divergent A/A pairs",
        ),
    ] = DEFAULT_PROMPTS,
    as_json: Annotated[bool, typer.Option("--json", help="print the calibration as JSON")] = False,
) -> None:
    """Measure the greedy tie margin on the baseline against itself (A/A; the speculative
    arm's own divergences are shown, never used) and store it: exit 0 stored, 3 too few
    divergent A/A pairs, 2 error."""
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
    body = calibration_json(result, row is not None, settings.gates)
    if as_json:
        json.dump(body, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(body, row)
    raise typer.Exit(EXIT_STORED if row is not None else EXIT_TOO_FEW)
