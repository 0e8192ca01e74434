"""The `canaryd` command: one entry point, one module per sub-command."""

from __future__ import annotations

import typer

from canaryd.cli import (
    audit,
    bench,
    db,
    gates,
    judge,
    models,
    once,
    probe,
    prompts,
    report,
    run,
    status,
    switch,
)

app = typer.Typer(
    name="canaryd",
    help="Canary and soak daemon for LLM serving with speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(models.app, name="models")
app.add_typer(prompts.app, name="prompts")
app.add_typer(db.app, name="db")
app.command("once")(once.once)
app.command("status")(status.status)
app.command("run")(run.run)
app.command("bench")(bench.bench)
app.command("report")(report.report)
app.add_typer(switch.app, name="switch")
app.command("gates")(gates.gates)
app.command("audit")(audit.audit)
app.command("judge")(judge.judge)
app.command("probe")(probe.probe)


def main() -> None:
    app()
