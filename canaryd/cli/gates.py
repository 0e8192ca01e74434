"""`canaryd gates`: each gate's latest decision with its evidence, from the database: the
switch arm's, then each comparison arm's (judged with every gate in `warn`, never
switching)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from canaryd.cli.common import handle_errors
from canaryd.cli.options import ConfigOption, UrlOption, settings_and_url
from canaryd.store import SqlStore
from gates import Evaluation, GateDecision


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _line(decision: GateDecision) -> str:
    bounds = f"[{_number(decision.lower)}, {_number(decision.upper)}]"
    return (
        f"{decision.name:<20} {decision.state.value:<12} {decision.mode.value:<8} "
        f"{decision.statistic or '-'} = {_number(decision.estimate)} {bounds} "
        f"vs {_number(decision.threshold)}; n={decision.n_baseline}/{decision.n_speculative}"
        f"{' critical' if decision.critical else ''}"
        + (f"; categories: {', '.join(decision.categories)}" if decision.categories else "")
    )


@handle_errors
def gates(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the evaluation as JSON (every field).")
    ] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Each gate's latest decision: state, mode, statistic, estimate, bounds, threshold, n."""
    settings, resolved = settings_and_url(config, url)
    with SqlStore.open(resolved) as store:
        evaluation = store.latest_evaluation()
        compared = {
            arm: store.latest_evaluation(comparison_arm=arm) for arm in settings.comparison_arms
        }
    if json_output:
        payload: dict[str, Any] = {
            **_json(evaluation),
            "arm": settings.switch_arm,
            "comparison_arms": {arm: _json(found) for arm, found in compared.items()},
        }
        typer.echo(json.dumps(payload, indent=2, sort_keys=True))
        return
    if evaluation is None:
        typer.echo("no gate decisions recorded yet; the daemon (`canaryd run`) evaluates them")
        return
    _print(evaluation)
    for arm, found in compared.items():
        typer.echo(f"\ncomparison arm {arm} (gated in warn mode, never switches):")
        if found is None:
            typer.echo("no gate decisions recorded yet")
        else:
            _print(found)


def _json(evaluation: Evaluation | None) -> dict[str, Any]:
    return {
        "evaluated_at": evaluation.at.isoformat() if evaluation else None,
        "gates": [d.to_dict() for d in evaluation.decisions] if evaluation else [],
    }


def _print(evaluation: Evaluation) -> None:
    age = (datetime.now(UTC) - evaluation.at).total_seconds()
    typer.echo(f"evaluated at {evaluation.at.isoformat(timespec='seconds')} ({age:.0f}s ago)")
    for decision in evaluation.decisions:
        typer.echo(_line(decision))
        typer.echo(f"    {decision.detail}")
