"""`canaryd report`: one self-contained HTML file, and the same tables as Markdown."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from canaryd.cli.common import fail, handle_errors
from canaryd.cli.options import ConfigOption, SinceOption, UrlOption, settings_and_url
from canaryd.durations import DEFAULT_SINCE, parse_since
from canaryd.logs import configure_logging
from canaryd.report import build_report
from canaryd.store import SqlStore, mask_url


@handle_errors
def report(
    since: SinceOption = None,
    run: Annotated[str | None, typer.Option("--run", help="report one run by its id")] = None,
    out: Annotated[Path, typer.Option("--out", help="HTML file to write")] = Path("report.html"),
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Write an HTML report (plots embedded) and print its tables as Markdown."""
    configure_logging(level="WARNING")
    if since is not None and run is not None:
        raise fail("give --since or --run, not both")
    now = datetime.now(UTC)
    start = None if run is not None else parse_since(since or DEFAULT_SINCE, now)
    until = None if run is not None else now
    _, database = settings_and_url(config, url)
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
