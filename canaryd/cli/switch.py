"""`canaryd switch`: the rollback switch from a terminal — status, the kill switch, restore.

Every command works with the daemon stopped and reads the service's settings (the
default config file when none is named): it opens the database itself, never creating
one, changes the switch under the same row lock as the daemon, writes the state file, runs
the configured hooks, and prints the config, database (password masked) and state file it
used. Exit codes: 0 done (or nothing to do; a hook that cannot be built here, such as a
webhook whose secret only the service's environment holds, is reported and recorded as a
failed actuation for the daemon to re-send); 1 the state was recorded but the state file
or a hook failed (the daemon re-applies it), or a restore was refused; 2 a configuration
or database problem.

The kill switch outlives the database: when it fails in any way (unreachable, missing,
corrupt, read-only, permission denied, locked), `rollback` writes the state file alone
(marked `pending_sync`), runs the hooks and exits 0 with a warning that the database was
not updated; the next command or gate run that reaches the database adopts it. `restore`
and `auto` refuse without the database.

`--category C` moves one traffic category's own switch instead of the top level's (the
master, which still turns speculation off everywhere when rolled back); its restore needs
fresh PASS evidence for that category, or `--force`. It needs the database: the kill
switch without it is the master's.

A top-level `restore` that is not refused also restores the revisions a rollout tool is
judging (every arm's current one), even when speculation was on already: each one's
latched FAIL is cleared and its evidence restarts now; each is printed.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal, ParamSpec, TypeVar

import typer

from canaryd import paths
from canaryd.cli.common import fail, handle_errors
from canaryd.cli.options import ConfigOption, UrlOption, switch_settings_and_url
from canaryd.cli.switch_database import switch_database
from canaryd.config import DEFAULT_CONFIG_PATH, SwitchSettings, config_path, load_switch_settings
from canaryd.durations import parse_duration
from canaryd.errors import ActuatorError, DatabaseError
from canaryd.logs import deferred_logging
from canaryd.store.database import mask_url
from canaryd.switch import (
    PENDING_SYNC,
    STATE_FILE_ACTUATOR,
    SwitchChange,
    SwitchService,
    build_actuators,
    emergency_rollback,
    nginx,
    read_state_file,
    shows,
    state_object,
)
from gates import Evaluation, SwitchEvent, SwitchMode, SwitchState
from gates.core import category_decisions

P = ParamSpec("P")
R = TypeVar("R")


app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The rollback switch: status, rollback (kill switch), restore, auto.",
)

ReasonOption = Annotated[str, typer.Option("--reason", help="Why; recorded in the audit trail.")]
CategoryOption = Annotated[
    str | None,
    typer.Option(
        "--category",
        help="Move only this traffic category's switch (the top level stays the master).",
    ),
]


def user() -> str:
    return getpass.getuser()


def evidence_lines(
    evaluation: Evaluation | None, now: datetime, category: str | None = None
) -> list[str]:
    """The latest gate evaluation, one line per gate (or, for a `category`, per enforce
    check of that category), for a person deciding a restore."""
    if evaluation is None:
        return ["latest gate evidence: none (the gates have never run)"]
    age = (now - evaluation.at).total_seconds()
    lines = [
        f"latest gate evidence: {evaluation.at.isoformat(timespec='seconds')} ({age:.0f}s ago)"
    ]
    if category is not None:
        checks = category_decisions(evaluation.decisions, category)
        if not checks:
            lines.append(f"  no enforce gate judged category {category!r}")
        for d in checks:
            lines.append(f"  {d.name:<9} {d.state.value:<12} {d.detail}")
        return lines
    for d in evaluation.decisions:
        marker = "" if d.enforced else f" [{d.mode.value}]"
        lines.append(f"  {d.name:<9} {d.state.value:<12}{marker} {d.detail}")
    return lines


def category_lines(state: SwitchState) -> list[str]:
    """The per-category switches, for `switch status`."""
    if not state.categories:
        return ["categories: none set (every category follows the top level)"]
    master = "" if state.speculative_enabled else " (the top level is rolled back: all off)"
    lines = [f"categories:{master}"]
    for name, own in state.categories:
        enabled = "ENABLED" if state.enabled_for(name) else "DISABLED"
        since = own.since.isoformat() if own.since else "-"
        latch = " (LATCHED: only a human can restore)" if own.latched else ""
        cooldown = (
            f" cooldown until {own.cooldown_until.isoformat()}"
            if own.cooldown_until is not None and own.mode is SwitchMode.ROLLED_BACK
            else ""
        )
        lines.append(
            f"  {name}: {own.mode.value} (speculative decoding {enabled}) control="
            f"{own.control.value}{latch} generation={own.generation} since {since}"
            f"{cooldown} by {own.actor or '-'}: {own.reason}"
        )
    return lines


def _since(state: SwitchState) -> str:
    """When the switch last moved and who moved it; a switch never moved says so."""
    if state.since is None:
        return "never moved (the initial state)"
    return f"{state.since.isoformat()} by {state.actor or '-'}"


def _adopted_line(change: SwitchChange) -> str | None:
    adopted = change.adopted
    if adopted is None:
        return None
    return (
        f"synced the state file's emergency {adopted.target.value} (generation "
        f"{adopted.generation}, by {adopted.actor}) into the database"
    )


def _sources(
    config: Path | None,
    url: str,
    settings: SwitchSettings,
    *,
    err: bool = False,
    state_file: bool = True,
) -> None:
    """Which config, database and state file this command used; a warning when the
    database or state file are the built-in defaults, which the service may not use."""
    typer.echo(f"config: {config if config is not None else 'none (built-in defaults)'}", err=err)
    typer.echo(f"database: {mask_url(url)}", err=err)
    if state_file:
        typer.echo(f"state file: {settings.switch.resolved_state_file()}", err=err)
    defaults = []
    # Named by the config (or the environment), it is the service's even where it equals
    # the default path, as in the image (CANARYD_DATA_DIR=/var/lib/canaryd).
    if settings.storage.url is None and url == paths.default_database_url():
        defaults.append("database")
    if settings.switch.state_file is None:
        defaults.append("state file")
    if defaults:
        typer.echo(
            f"canaryd: warning: {' and '.join(defaults)}: canaryd's built-in default under "
            f"{paths.data_dir()}, not necessarily the service's; name the service's config "
            f"with --config (conventionally {DEFAULT_CONFIG_PATH})",
            err=True,
        )


def _report(
    change: SwitchChange,
    service: SwitchService,
    verb: str,
    unbuilt: set[str],
    category: str | None = None,
) -> int:
    state = change.state
    adopted = _adopted_line(change)
    if adopted is not None:
        typer.echo(adopted)
    own = state.category(category) if category is not None else None
    if category is not None and own is not None and change.outcome.transitions:
        typer.echo(
            f"switch category {category} {verb}: mode={own.mode.value} speculative_enabled="
            f"{str(state.enabled_for(category)).lower()} generation={state.generation} "
            f"actor={own.actor}"
        )
    elif category is not None:
        mode = own.mode.value if own is not None else "follows the top level"
        typer.echo(
            f"switch category {category} unchanged: {mode} (top level mode="
            f"{state.mode.value}, generation={state.generation})"
        )
    elif change.outcome.transitions:
        typer.echo(
            f"switch {verb}: mode={state.mode.value} speculative_enabled="
            f"{str(state.speculative_enabled).lower()} generation={state.generation} "
            f"actor={state.actor}"
        )
    else:
        typer.echo(
            f"switch unchanged: mode={state.mode.value} control={state.control.value} "
            f"generation={state.generation} (since {_since(state)})"
        )
    for window in change.restored:
        cleared = f"its FAIL cleared ({window.failure})" if window.failed_at else "no FAIL stood"
        typer.echo(
            f"revision {window.revision!r} of {window.arm}: {cleared}; its evidence restarts now"
        )
    report = change.report
    if report is None:
        return 0
    if report.file_skipped:
        typer.echo(f"state file {service.state_file} already holds a newer generation", err=True)
    failed = False
    for actuator, error in report.failures.items():
        if actuator in unbuilt:
            # Its secret lives in the service's environment: the daemon re-sends it.
            typer.echo(
                f"canaryd: warning: {actuator}: not run from here: {error} (recorded as a "
                f"failed actuation; the daemon re-sends it on its next gate run)",
                err=True,
            )
        else:
            failed = True
            typer.echo(f"canaryd: warning: {actuator}: {error}", err=True)
    if failed:
        if STATE_FILE_ACTUATOR in report.failures:
            on_disk = read_state_file(service.state_file)
            enabled = on_disk.get("speculative_enabled") if on_disk else None
            reads = (
                "no state file (a router following docs/switch.md turns speculation off)"
                if on_disk is None
                else f"the old state (generation {on_disk.get('generation')}, "
                f"speculative_enabled={str(enabled).lower()}"
                + (": speculation is still ON)" if enabled else ")")
            )
            cause = str(report.failures[STATE_FILE_ACTUATOR])
            fix = (
                "Find the process that holds the state file's lock (`fuser -v` names it; a "
                "frozen writer), stop it"
                if "held the lock" in cause
                else "Fix the file's directory (space, permissions)"
            )
            typer.echo(
                f"canaryd: warning: the database holds generation {state.generation}, but "
                f"the state file {str(service.state_file)!r} could not be written: "
                f"production still reads {reads}. {fix}, then rerun this command",
                err=True,
            )
        typer.echo(
            "the state is recorded in the database; the daemon re-applies it on its next "
            "gate run (or rerun this command)",
            err=True,
        )
        return 1
    return 0


def _through_database(
    action: Literal["rollback", "restore", "auto"],
    reason: str,
    settings: SwitchSettings,
    url: str,
    config: Path | None,
    *,
    force: bool,
    category: str | None = None,
) -> int:
    # Never `create`: a missing database is a wrong URL far more often than a new box,
    # and the kill switch then takes the state-file path instead of hiding in a new file.
    then = (
        "the kill switch writes the state file alone"
        if action == "rollback" and category is None
        else f"`switch {action}` gives up"
    )
    with switch_database(url, then) as store:
        unbuilt: list[ActuatorError] = []
        actuators = build_actuators(settings.switch, on_error=unbuilt.append)
        service = SwitchService(store, settings.switch, settings.gates.policy, actuators=actuators)
        now = datetime.now(UTC)
        if action == "restore":
            for line in evidence_lines(store.latest_evaluation(), now, category):
                typer.echo(line)
        event = SwitchEvent(action, user(), reason, force=force, category=category)
        change = service.command(event)
    for refusal in change.outcome.refused:
        raise fail(refusal, 1)
    _sources(config, url, settings)
    verb = {"rollback": "rolled back", "restore": "restored", "auto": "handed to the gates"}
    return _report(change, service, verb[action], {e.actuator for e in unbuilt}, category)


def _emergency(
    settings: SwitchSettings, url: str, config: Path | None, reason: str, error: DatabaseError
) -> int:
    """The kill switch without the database: the state file alone, then the hooks."""
    _sources(config, url, settings, state_file=False)  # the file: below, with its outcome
    typer.echo(
        f"canaryd: warning: the database is unreachable or unusable, so the database was "
        f"NOT updated: {error}",
        err=True,
    )
    result = emergency_rollback(settings.switch, user(), reason)
    for actuator, failure in result.failures.items():
        typer.echo(f"canaryd: warning: {actuator}: {failure}", err=True)
    path = settings.switch.resolved_state_file()
    if not result.written:
        hooks = "" if result.failures else " (the configured hooks, if any, were run)"
        raise fail(
            f"the database was not updated and the state file could not be written either: "
            f"{result.file_error}; speculative decoding is NOT rolled back through the state "
            f"file{hooks} - flip production by hand",
            2,
        )
    state = result.state
    typer.echo(
        f"switch rolled back IN THE STATE FILE ONLY (database not updated): "
        f"mode={state['mode']} speculative_enabled=false generation={state['generation']} "
        f"actor={state['actor']}"
    )
    typer.echo(f"state file: {path} ({PENDING_SYNC}: true)")
    typer.echo(
        "to be synced: the daemon's next gate run or the next `canaryd switch` command "
        "records it in the database once the database works again"
    )
    return 0


def _logging_deferred(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` with structlog configured (warnings and above, on stderr: stdout is what a
    person or script reads) only if something logs: most runs import no structlog."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with deferred_logging(level="WARNING"):
            return fn(*args, **kwargs)

    return wrapper


@_logging_deferred
def _command(
    action: Literal["rollback", "restore", "auto"],
    reason: str,
    config: Path | None,
    url: str | None,
    *,
    force: bool = False,
    category: str | None = None,
) -> None:
    source = config_path(config)
    settings, resolved = switch_settings_and_url(source, url)
    try:
        code = _through_database(
            action, reason, settings, resolved, source, force=force, category=category
        )
    except DatabaseError as exc:
        if category is not None:
            raise fail(
                f"switch {action} --category {category} refused: the database is unreachable "
                f"or unusable; without it only the top level's kill switch works "
                f"(`canaryd switch rollback` without --category) ({exc})",
                2,
            ) from None
        if action != "rollback":
            # Re-enabling (or handing control back) must go through the authoritative store.
            raise fail(
                f"switch {action} refused: the database is unreachable or unusable and only "
                f"a rollback works without it ({exc})",
                2,
            ) from None
        code = _emergency(settings, resolved, source, reason, exc)
    if code:
        raise typer.Exit(code)


@app.command()
@handle_errors
@_logging_deferred
def status(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the state object (as in the state file).")
    ] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """The switch as stored: mode, reason, actor, generation; state file and hooks."""
    source = config_path(config)
    settings, resolved = switch_settings_and_url(source, url)
    path = settings.switch.resolved_state_file()
    with switch_database(resolved, "`switch status` gives up") as store:
        on_disk = read_state_file(path)
        if on_disk is not None and on_disk.get(PENDING_SYNC) is True:
            change = SwitchService(store, settings.switch, settings.gates.policy).adopt_pending()
            adopted = _adopted_line(change) if change is not None else None
            if adopted is not None:
                typer.echo(adopted, err=True)  # stderr: keeps `--json` parseable
        record = store.switch()
    obj = state_object(record.state)
    if json_output:
        _sources(source, resolved, settings, err=True)  # stderr: keeps `--json` parseable
        typer.echo(json.dumps(obj, indent=2, sort_keys=True))
        return
    _sources(source, resolved, settings, state_file=False)  # the file: below, with its sync
    state = record.state
    typer.echo(
        f"mode: {state.mode.value} (speculative decoding "
        f"{'ENABLED' if state.speculative_enabled else 'DISABLED'})"
    )
    latched = " (LATCHED: only a human can restore)" if state.latched else ""
    typer.echo(f"control: {state.control.value}{latched}")
    typer.echo(f"reason: {state.reason}")
    typer.echo(f"since: {_since(state)}")
    typer.echo(f"generation: {state.generation}")
    if state.cooldown_until is not None:
        typer.echo(f"cooldown until: {state.cooldown_until.isoformat()}")
    for line in category_lines(state):
        typer.echo(line)
    on_disk = read_state_file(path)
    if shows(on_disk, record.state):
        typer.echo(f"state file: {path} (in sync)")
    else:
        seen = "missing" if on_disk is None else f"generation {on_disk.get('generation')}"
        typer.echo(f"state file: {path} (OUT OF SYNC: {seen}; the daemon rewrites it)")
    if record.actuator_errors:
        for actuator, error in sorted(record.actuator_errors.items()):
            typer.echo(f"actuator {actuator}: FAILED: {error}")
    elif record.applied:
        typer.echo("actuators: applied")


@app.command()
@handle_errors
def rollback(
    reason: ReasonOption,
    category: CategoryOption = None,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Kill switch: disable speculative decoding now; gates cannot undo it. When the
    database fails in any way, writes the state file alone (synced into it later)."""
    _command("rollback", reason, config, url, category=category)


@app.command()
@handle_errors
def restore(
    reason: ReasonOption,
    force: Annotated[
        bool,
        typer.Option("--force", help="Restore without fresh PASS evidence (recorded as FORCED)."),
    ] = False,
    category: CategoryOption = None,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Re-enable speculative decoding: needs every enforce gate PASS in a fresh evaluation
    (for a category: every enforce check of that category)."""
    _command("restore", reason, config, url, force=force, category=category)


@app.command()
@handle_errors
def auto(
    reason: ReasonOption = "control handed back to the gates",
    category: CategoryOption = None,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Hand control back to the gates (after a manual rollback); the mode stays as it is."""
    _command("auto", reason, config, url, category=category)


@app.command("nginx-map")
@handle_errors
def nginx_map(
    out: Annotated[
        Path, typer.Option("--out", help="The map file nginx includes (replaced atomically).")
    ],
    reload_command: Annotated[
        str | None,
        typer.Option(
            "--reload-command",
            help="Run when the routes changed, e.g. 'nginx -s reload' (no shell).",
            show_default=False,
        ),
    ] = None,
    state_file: Annotated[
        Path | None,
        typer.Option(
            "--state-file",
            help="Read this state file (default: the config's; as a command hook, the "
            "state canaryd hands over in CANARYD_SWITCH_JSON).",
            show_default=False,
        ),
    ] = None,
    max_age: Annotated[
        str, typer.Option("--max-age", help="A state file confirmed longer ago is stale.")
    ] = "5m",
    header: Annotated[
        str, typer.Option("--header", help="The request header naming the category.")
    ] = "X-Canaryd-Category",
    variable: Annotated[
        str, typer.Option("--variable", help="The nginx variable set to the upstream.")
    ] = "canaryd_upstream",
    speculative_upstream: Annotated[
        str, typer.Option("--speculative-upstream", help="The speculative upstream's name.")
    ] = nginx.SPECULATIVE,
    baseline_upstream: Annotated[
        str, typer.Option("--baseline-upstream", help="The baseline upstream's name.")
    ] = nginx.BASELINE,
    config: ConfigOption = None,
) -> None:
    r"""Render the switch as an nginx map (category header → upstream) and reload nginx
    when the routes changed: as a `\[switch.command]` hook on each generation and from a
    timer, which turns speculation off when the state file goes stale."""
    delivered_json = os.environ.get("CANARYD_SWITCH_JSON") if state_file is None else None
    if delivered_json is not None:
        try:
            delivered = json.loads(delivered_json)
        except ValueError as exc:
            raise fail(
                f"CANARYD_SWITCH_JSON is not JSON ({exc}); is this a canaryd hook?"
            ) from None
        state = delivered if isinstance(delivered, dict) else None
        source = "the state canaryd handed over (CANARYD_SWITCH_JSON)"
    else:
        path = state_file or (
            load_switch_settings(config_path(config)).switch.resolved_state_file()
        )
        state = read_state_file(path)
        source = str(path)
    found = nginx.routes(
        state,
        now=datetime.now(UTC),
        max_age=parse_duration(max_age),
        delivered=delivered_json is not None,
    )
    try:
        text = nginx.render_map(
            found,
            header=header,
            variable=variable,
            speculative_upstream=speculative_upstream,
            baseline_upstream=baseline_upstream,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    try:
        done = nginx.write_map(out, text, found, reload_command)
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc}") from None
    except RuntimeError as exc:
        raise fail(str(exc), 1) from None
    typer.echo(f"{done.message} [from {source}]")
