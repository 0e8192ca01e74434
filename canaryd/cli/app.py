"""The `canaryd` command: one entry point, one module per sub-command, each imported only
when it runs.

`COMMANDS` names every sub-command, the module and attribute that define it (a function,
or a Typer app for a group such as `switch`) and the one-line summary `canaryd --help`
lists, so that neither `--help`, `--version` nor the kill switch pays for the imports of
the daemon, the engines or the statistics (a test checks each summary against the
command's own help). `canaryd --version` prints the installed version.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer

# typer builds its commands from its own copy of click (typer._click).
from typer._click.core import Command, Context, Parameter
from typer._click.exceptions import (
    BadParameter,
    ClickException,
    MissingParameter,
    NoArgsIsHelpError,
    NoSuchOption,
)
from typer._click.formatting import HelpFormatter
from typer.core import TyperCommand, TyperGroup, TyperOption

from canaryd import __version__


@dataclass(frozen=True, slots=True)
class CommandEntry:
    """Where a sub-command is defined and what `canaryd --help` says of it."""

    module: str
    attribute: str
    summary: str


COMMANDS: dict[str, CommandEntry] = {
    "models": CommandEntry("canaryd.cli.models", "app", "Provision and locate models."),
    "prompts": CommandEntry(
        "canaryd.cli.prompts",
        "app",
        "Check and inspect prompt suites (native .jsonl or MT-Bench question.jsonl).",
    ),
    "db": CommandEntry("canaryd.cli.db", "app", "Create, upgrade and inspect the database schema."),
    "once": CommandEntry(
        "canaryd.cli.once",
        "once",
        "Run N baseline-vs-speculative pairs now, store them, and print a summary.",
    ),
    "status": CommandEntry(
        "canaryd.cli.status",
        "status",
        "Last cycle, pairs per category, per-arm P50/P99 and ITL, acceptance, fallback, errors.",
    ),
    "run": CommandEntry(
        "canaryd.cli.run",
        "run",
        "Run the soak daemon: pairs on a schedule, /metrics, /healthz and /readyz.",
    ),
    "bench": CommandEntry(
        "canaryd.cli.bench",
        "bench",
        "Run the one-shot evaluation: warm-up, concurrency ladder, acceptance, consistency.",
    ),
    "report": CommandEntry(
        "canaryd.cli.report",
        "report",
        "Write an HTML report (plots embedded) and print its tables as Markdown.",
    ),
    "switch": CommandEntry(
        "canaryd.cli.switch",
        "app",
        "The rollback switch: status, rollback (kill switch), restore, auto.",
    ),
    "gates": CommandEntry(
        "canaryd.cli.gates",
        "gates",
        "Each gate's latest decision: state, mode, statistic, estimate, bounds, threshold, n.",
    ),
    "audit": CommandEntry(
        "canaryd.cli.audit",
        "audit",
        "Switch transitions and refused commands: time, actor, reason, evidence.",
    ),
    "judge": CommandEntry(
        "canaryd.cli.judge",
        "judge",
        "Judge a candidate against a baseline now: exit 0 PASS, 1 FAIL, 3 undecided, 2 error.",
    ),
    "calibrate": CommandEntry(
        "canaryd.cli.calibrate",
        "calibrate_command",
        "Measure the greedy tie margin on the baseline against itself (A/A; the speculative "
        "arm's own divergences are shown, never used) and store it: exit 0 stored, 3 too few "
        "divergent A/A pairs, 2 error.",
    ),
    "probe": CommandEntry(
        "canaryd.cli.probe",
        "probe",
        "Probe what the speculative arm still supports: exit 0 parity, 1 regression, 2 error "
        "(or a run --timeout cut short).",
    ),
}


def load_command(name: str) -> Command:
    """Import sub-command `name` and build its click command."""
    entry = COMMANDS[name]
    defined = getattr(importlib.import_module(entry.module), entry.attribute)
    if isinstance(defined, typer.Typer):
        command = typer.main.get_command(defined)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(defined)
        command = typer.main.get_command(single)
    command.name = name
    quiet_flags(command)
    return command


def quiet_flags(command: Command) -> None:
    """A flag takes no value: no `<bool>` type beside it in the help (of `command` and of
    every command under it)."""
    for param in command.get_params(Context(command)):
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            quiet_flags(sub)


class LazyGroup(TyperGroup):
    """The top-level group: a sub-command is imported when it is run, or when its own
    help is asked for; the top-level help lists the summaries of `COMMANDS`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:  # the summary alone: no import
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].summary)
        if cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands[cmd_name]

    # A usage error anywhere below (an unknown option, a missing argument, a bad value,
    # parsed here or by a sub-command while this group invokes it) is one line, as config
    # errors are, instead of Typer's boxed usage: the parse and the invocation are the two
    # places click raises them from.
    def make_context(self, *args: Any, **kwargs: Any) -> Context:
        try:
            return super().make_context(*args, **kwargs)
        except ClickException as exc:
            raise usage_exit(exc) from None

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClickException as exc:
            # Without a context of its own (an option missing its value), the error is the
            # sub-command's this group was invoking: its help is the one to read.
            sub = ctx.invoked_subcommand
            command = self.commands.get(sub) if sub else None
            where = Context(command, info_name=sub, parent=ctx) if command else ctx
            raise usage_exit(exc, where) from None

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        quiet_flags(self)
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def usage_line(exc: ClickException, ctx: Context | None = None) -> str:
    """`exc` as one line: what is wrong, naming the flag, then where the help is (`see
    canaryd once --help`); `ctx` stands in where click raised it without a context."""
    if isinstance(exc, NoSuchOption):
        what = f"no such option {exc.option_name}"
        if exc.possibilities:
            what += f" (did you mean {' or '.join(sorted(exc.possibilities))}?)"
    elif isinstance(exc, BadParameter) and not isinstance(exc, MissingParameter):
        hint = flag_name(exc.param) if exc.param else exc.param_hint
        what = f"invalid value for {hint}: {exc.message}" if hint else exc.format_message()
    elif isinstance(exc, MissingParameter) and exc.param:
        what = f"missing {exc.param.param_type_name} {flag_name(exc.param)}"
    else:
        what = exc.format_message()
    what = " ".join(what.split()).rstrip(".")
    what = what[:1].lower() + what[1:]
    where = getattr(exc, "ctx", None) or ctx
    if where is None:
        return what
    return f"{what} (see {where.command_path} {where.help_option_names[0]})"


def flag_name(param: Parameter) -> str:
    """How the user spells `param`: its long flag (`--pairs`), else what the help shows
    for it (an argument's metavar, `PATH`)."""
    if isinstance(param, TyperOption) and param.opts:
        return max(param.opts, key=len)
    return param.metavar or (param.name or "value").upper()


def usage_exit(exc: ClickException, ctx: Context | None = None) -> ClickException | typer.Exit:
    """Print `exc` as `canaryd: error: …` on stderr and return the Exit (its exit code, 2
    for usage) to raise; a bare group's help (`canaryd switch`) passes through as it is."""
    if isinstance(exc, NoArgsIsHelpError):
        return exc
    print(f"canaryd: error: {usage_line(exc, ctx)}", file=sys.stderr)
    return typer.Exit(exc.exit_code)


app = typer.Typer(
    name="canaryd",
    cls=LazyGroup,
    help="Canary and soak daemon for LLM serving with speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"canaryd {__version__}")
        raise typer.Exit


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print canaryd's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Canary and soak daemon for LLM serving with speculative decoding."""


def main() -> None:
    # The name a user types, also under `python -m canaryd`: usage errors quote it.
    app(prog_name="canaryd")
