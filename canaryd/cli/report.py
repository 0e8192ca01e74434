"""`canaryd report`: one self-contained HTML file, and the same tables as Markdown."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from canaryd.cli.common import fail, handle_errors
from canaryd.config import load_settings
from canaryd.logs import configure_logging
from canaryd.report import build_report, parse_duration
from canaryd.store import SqlStore
from canaryd.store.sql import mask_url


@handle_errors
def report(
    since: Annotated[
        str | None, typer.Option(help="window ending now, e.g. 30m, 24h, 7d (default 24h)")
    ] = None,
    run: Annotated[str | None, typer.Option("--run", help="report one run by its id")] = None,
    out: Annotated[Path, typer.Option("--out", help="HTML file to write")] = Path("report.html"),
    url: Annotated[
        str | None,
        typer.Option(help="database URL (default: the config's storage.url, else the default)"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="TOML config file (for storage.url)"),
    ] = None,
) -> None:
    """Write an HTML report (plots embedded) and print its tables as Markdown."""
    configure_logging(level="WARNING")
    if since is not None and run is not None:
        raise fail("give --since or --run, not both")
    try:
        window = parse_duration(since or "24h")
    except ValueError as exc:
        raise fail(str(exc)) from None
    database = url or load_settings(config).storage.resolved_url()
    now = datetime.now(UTC)
    start = None if run is not None else now - window
    until = None if run is not None else now
    store = SqlStore.open(database)
    try:
        built = build_report(
            store, run_id=run, since=start, until=until, database=mask_url(database)
        )
    finally:
        store.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(built.html(), encoding="utf-8")
    sys.stdout.write(built.markdown())
    sys.stdout.write(f"\nwrote {out} ({len(built.plots)} plots)\n")
