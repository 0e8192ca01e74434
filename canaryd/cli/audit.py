"""`canaryd audit`: the switch's audit trail — every transition and refused command."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer

from canaryd.cli.common import handle_errors
from canaryd.cli.options import ConfigOption, SinceOption, UrlOption, settings_and_url
from canaryd.durations import DEFAULT_SINCE, parse_since
from canaryd.store import SqlStore


@handle_errors
def audit(
    since: SinceOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Switch transitions and refused commands: time, actor, reason, evidence."""
    start = parse_since(since or DEFAULT_SINCE, datetime.now(UTC))
    _, resolved = settings_and_url(config, url)
    with SqlStore.open(resolved) as store:
        entries = store.audit(since=start)
    if json_output:
        typer.echo(json.dumps([e.to_dict() for e in entries], indent=2, sort_keys=True))
        return
    if not entries:
        typer.echo(f"no switch changes since {start.isoformat(timespec='seconds')}")
        return
    for entry in entries:
        what = (
            f"{entry.previous} -> {entry.target} ({entry.control})"
            if entry.kind == "transition"
            else "REFUSED"
        )
        gates = ", ".join(f"{e['name']}={e['state']}" for e in entry.evidence) or "no evidence"
        typer.echo(
            f"{entry.at.isoformat(timespec='seconds')} gen {entry.generation} {what} "
            f"by {entry.actor}: {entry.reason} [{gates}]"
        )
