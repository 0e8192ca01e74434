"""`canaryd audit`: the switch's audit trail — every transition and refused command."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from canaryd.cli.common import handle_errors
from canaryd.cli.switch import ConfigOption, UrlOption, settings_and_url
from canaryd.errors import CanarydError
from canaryd.store import SqlStore

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class SinceError(CanarydError, ValueError):
    def __init__(self, value: str) -> None:
        super().__init__(
            f"--since {value!r}: expected a duration (30m, 24h, 7d) or an ISO time "
            f"(2025-12-01T08:00:00+00:00; no zone means UTC)"
        )


def parse_since(value: str, now: datetime) -> datetime:
    """`24h`-style durations back from `now`, or an ISO 8601 time (naive: UTC)."""
    match = _DURATION.match(value.strip())
    if match:
        return now - timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise SinceError(value) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@handle_errors
def audit(
    since: Annotated[
        str, typer.Option("--since", help="A duration back from now (24h, 7d) or an ISO time.")
    ] = "24h",
    json_output: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Switch transitions and refused commands: time, actor, reason, evidence."""
    start = parse_since(since, datetime.now(UTC))
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
