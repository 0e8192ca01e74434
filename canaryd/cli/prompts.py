"""`canaryd prompts`: validate suite files and show what the suites contain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from canaryd.cli.common import handle_errors
from canaryd.errors import PromptFileError
from canaryd.pairs.suites import Suite, load_suites, suite_files, validate_path
from canaryd.paths import prompts_dir

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Check and inspect prompt suites (native .jsonl or MT-Bench question.jsonl).",
)


@app.command("validate")
def validate(
    paths: Annotated[
        list[Path],
        typer.Argument(metavar="PATH", help="Suite files, or directories of *.jsonl suite files."),
    ],
) -> None:
    """Report every problem in the suite files as `file:line: reason`; exit 1 if any."""
    problems: list[str] = []
    for path in paths:
        found = validate_path(path)
        for problem in found:
            typer.echo(problem)
        problems.extend(found)
    suites: list[Suite] = []
    if not problems:
        # Each file is valid on its own; loading them together also finds an id that two
        # suites both define.
        try:
            suites = load_suites(paths)
        except PromptFileError as exc:
            for problem in exc.problems:
                typer.echo(problem)
            problems.extend(exc.problems)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        typer.echo(f"{len(problems)} {noun} in {_count_files(paths)}")
        raise typer.Exit(1)
    prompt_count = sum(len(suite.prompts) for suite in suites)
    typer.echo(f"ok: {_count_files(paths)}, {prompt_count} prompts, no problems")


@app.command("list")
@handle_errors
def list_prompts(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="PATH", help="Suite files or directories; default: the shipped suites."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show how many prompts each suite has per category."""
    suites = load_suites(paths or [prompts_dir()])
    if as_json:
        typer.echo(json.dumps([_suite_summary(suite) for suite in suites], indent=2))
        return
    table = Table(title="prompt suites")
    table.add_column("suite")
    table.add_column("category")
    table.add_column("prompts", justify="right")
    table.add_column("checked", justify="right")
    table.add_column("with reference", justify="right")
    for suite in suites:
        for category in suite.categories:
            prompts = suite.by_category(category)
            table.add_row(
                suite.name,
                category,
                str(len(prompts)),
                str(sum(prompt.check is not None for prompt in prompts)),
                str(sum(prompt.reference is not None for prompt in prompts)),
            )
    total = sum(len(suite.prompts) for suite in suites)
    table.add_section()
    table.add_row(
        "total", f"{len({c for s in suites for c in s.categories})} categories", str(total), "", ""
    )
    Console().print(table)


def _suite_summary(suite: Suite) -> dict[str, object]:
    return {
        "suite": suite.name,
        "path": str(suite.path),
        "sha256": suite.sha256,
        "prompts": len(suite.prompts),
        "categories": {c: len(suite.by_category(c)) for c in suite.categories},
    }


def _count_files(paths: list[Path]) -> str:
    count = sum(len(suite_files(path)) for path in paths)
    return f"{count} file" if count == 1 else f"{count} files"
