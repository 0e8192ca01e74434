"""`canaryd switch`: the rollback switch from a terminal — status, the kill switch, restore.

Every command works with the daemon stopped: it opens the database itself (a rollback
creates it if needed), changes the switch under the same row lock as the daemon, writes
the state file and runs the configured hooks. Exit codes: 0 done (or nothing to do);
1 the state was recorded but the state file or a hook failed (the daemon re-applies it),
or a restore was refused; 2 a configuration or database problem.

The kill switch outlives the database: when it is unreachable, `rollback` writes the state
file alone (marked `pending_sync`), runs the hooks and exits 0; the next command or gate
run that reaches the database adopts it. `restore` and `auto` refuse without the database.
"""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import typer

from canaryd.cli.common import fail, handle_errors
from canaryd.cli.options import ConfigOption, UrlOption, settings_and_url
from canaryd.config import Settings
from canaryd.errors import DatabaseError
from canaryd.store import SqlStore, mask_url
from canaryd.switch import (
    PENDING_SYNC,
    SwitchChange,
    SwitchService,
    emergency_rollback,
    read_state_file,
    state_object,
)
from gates import Evaluation, SwitchEvent

app = typer.Typer(
    no_args_is_help=True,
    help="The rollback switch: status, rollback (kill switch), restore, auto.",
)

ReasonOption = Annotated[str, typer.Option("--reason", help="Why; recorded in the audit trail.")]


def user() -> str:
    return getpass.getuser()


def evidence_lines(evaluation: Evaluation | None, now: datetime) -> list[str]:
    """The latest gate evaluation, one line per gate, for a person deciding a restore."""
    if evaluation is None:
        return ["latest gate evidence: none (the gates have never run)"]
    age = (now - evaluation.at).total_seconds()
    lines = [
        f"latest gate evidence: {evaluation.at.isoformat(timespec='seconds')} ({age:.0f}s ago)"
    ]
    for d in evaluation.decisions:
        marker = "" if d.enforced else f" [{d.mode.value}]"
        lines.append(f"  {d.name:<9} {d.state.value:<12}{marker} {d.detail}")
    return lines


def _adopted_line(change: SwitchChange) -> str | None:
    adopted = change.adopted
    if adopted is None:
        return None
    return (
        f"synced the state file's emergency {adopted.target.value} (generation "
        f"{adopted.generation}, by {adopted.actor}) into the database"
    )


def _report(change: SwitchChange, service: SwitchService, verb: str) -> int:
    state = change.state
    adopted = _adopted_line(change)
    if adopted is not None:
        typer.echo(adopted)
    if change.outcome.transitions:
        typer.echo(
            f"switch {verb}: mode={state.mode.value} speculative_enabled="
            f"{str(state.speculative_enabled).lower()} generation={state.generation} "
            f"actor={state.actor}"
        )
    else:
        typer.echo(
            f"switch unchanged: mode={state.mode.value} control={state.control.value} "
            f"generation={state.generation} (since {state.since}, by {state.actor or '-'})"
        )
    report = change.report
    if report is not None and report.file_skipped:
        typer.echo(f"state file {service.state_file} already holds a newer generation", err=True)
    if report is not None and not report.ok:
        for actuator, error in report.failures.items():
            typer.echo(f"canaryd: warning: {actuator}: {error}", err=True)
        typer.echo(
            "the state is recorded in the database; the daemon re-applies it on its next "
            "gate run (or rerun this command)",
            err=True,
        )
        return 1
    typer.echo(f"state file: {service.state_file}")
    return 0


def _open(url: str, *, create: bool) -> SqlStore:
    try:
        return SqlStore.open(url, create=create)
    except OSError as exc:  # e.g. the SQLite file's directory cannot be created
        raise DatabaseError(f"cannot open the database {mask_url(url)!r}: {exc}") from exc


def _through_database(
    action: Literal["rollback", "restore", "auto"],
    reason: str,
    settings: Settings,
    url: str,
    *,
    force: bool,
    create: bool,
) -> int:
    # `create`: the kill switch must work on a box where the daemon never ran.
    with _open(url, create=create) as store:
        service = SwitchService(store, settings.switch, settings.gates.policy)
        now = datetime.now(UTC)
        if action == "restore":
            for line in evidence_lines(store.latest_evaluation(), now):
                typer.echo(line)
        change = service.command(SwitchEvent(action, user(), reason, force=force))
        for refusal in change.outcome.refused:
            raise fail(refusal, 1)
        return _report(
            change,
            service,
            {"rollback": "rolled back", "restore": "restored", "auto": "handed to the gates"}[
                action
            ],
        )


def _emergency(settings: Settings, reason: str, error: DatabaseError) -> int:
    """The kill switch with the database down: the state file alone, then the hooks."""
    typer.echo(f"canaryd: warning: the database is unreachable: {error}", err=True)
    result = emergency_rollback(settings.switch, user(), reason)
    for actuator, failure in result.failures.items():
        typer.echo(f"canaryd: warning: {actuator}: {failure}", err=True)
    path = settings.switch.resolved_state_file()
    if not result.written:
        hooks = "" if result.failures else " (the configured hooks, if any, were run)"
        raise fail(
            f"the database is unreachable and the state file could not be written either: "
            f"{result.file_error}; speculative decoding is NOT rolled back through the state "
            f"file{hooks} - flip production by hand",
            2,
        )
    state = result.state
    typer.echo(
        f"switch rolled back IN THE STATE FILE ONLY (database unreachable): "
        f"mode={state['mode']} speculative_enabled=false generation={state['generation']} "
        f"actor={state['actor']}"
    )
    typer.echo(f"state file: {path} ({PENDING_SYNC}: true)")
    typer.echo(
        "to be synced: the daemon's next gate run or the next `canaryd switch` command "
        "records it in the database once the database is reachable again"
    )
    return 0


def _command(
    action: Literal["rollback", "restore", "auto"],
    reason: str,
    config: Path | None,
    url: str | None,
    *,
    force: bool = False,
    create: bool = False,
) -> None:
    settings, resolved = settings_and_url(config, url)
    try:
        code = _through_database(action, reason, settings, resolved, force=force, create=create)
    except DatabaseError as exc:
        if action != "rollback":
            # Re-enabling (or handing control back) must go through the authoritative store.
            raise fail(
                f"switch {action} refused: the database is unreachable and only a rollback "
                f"works without it ({exc})",
                2,
            ) from None
        code = _emergency(settings, reason, exc)
    if code:
        raise typer.Exit(code)


@app.command()
@handle_errors
def status(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the state object (as in the state file).")
    ] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """The switch as stored: mode, reason, actor, generation; state file and hooks."""
    settings, resolved = settings_and_url(config, url)
    path = settings.switch.resolved_state_file()
    with SqlStore.open(resolved) as store:
        on_disk = read_state_file(path)
        if on_disk is not None and on_disk.get(PENDING_SYNC) is True:
            change = SwitchService(store, settings.switch, settings.gates.policy).adopt_pending()
            adopted = _adopted_line(change) if change is not None else None
            if adopted is not None:
                typer.echo(adopted, err=True)  # stderr: keeps `--json` parseable
        record = store.switch()
    obj = state_object(record.state)
    if json_output:
        typer.echo(json.dumps(obj, indent=2, sort_keys=True))
        return
    state = record.state
    typer.echo(
        f"mode: {state.mode.value} (speculative decoding "
        f"{'ENABLED' if state.speculative_enabled else 'DISABLED'})"
    )
    latched = " (LATCHED: only a human can restore)" if state.latched else ""
    typer.echo(f"control: {state.control.value}{latched}")
    typer.echo(f"reason: {state.reason}")
    typer.echo(f"since: {state.since.isoformat() if state.since else '-'} by {state.actor or '-'}")
    typer.echo(f"generation: {state.generation}")
    if state.cooldown_until is not None:
        typer.echo(f"cooldown until: {state.cooldown_until.isoformat()}")
    on_disk = read_state_file(path)
    if on_disk == obj:
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
def rollback(reason: ReasonOption, url: UrlOption = None, config: ConfigOption = None) -> None:
    """Kill switch: disable speculative decoding now; gates cannot undo it. With the
    database unreachable, writes the state file alone (synced into the database later)."""
    _command("rollback", reason, config, url, create=True)


@app.command()
@handle_errors
def restore(
    reason: ReasonOption,
    force: Annotated[
        bool,
        typer.Option("--force", help="Restore without fresh PASS evidence (recorded as FORCED)."),
    ] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Re-enable speculative decoding: needs every enforce gate PASS in a fresh evaluation."""
    _command("restore", reason, config, url, force=force)


@app.command()
@handle_errors
def auto(
    reason: ReasonOption = "control handed back to the gates",
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Hand control back to the gates (after a manual rollback); the mode stays as it is."""
    _command("auto", reason, config, url)
