"""The options several commands share, each defined once: `--config/-c`, `--url` and
`--since`, with one help text and one reading (`settings_and_url`, `parse_since`), so
that every command finds the same configuration and the same database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from canaryd.config import DEFAULT_CONFIG_PATH, Settings, load_settings
from canaryd.store import EXPECTED_URL_FORMS

__all__ = [
    "CONFIG_HELP",
    "SINCE_HELP",
    "URL_HELP",
    "ConfigOption",
    "SinceOption",
    "UrlOption",
    "settings_and_url",
]

CONFIG_HELP = (
    f"TOML config file (default: env CANARYD_CONFIG, else {DEFAULT_CONFIG_PATH} if it "
    "exists, else built-in defaults; CANARYD_CONFIG= (empty) reads no file)."
)
URL_HELP = (
    f"Database URL ({EXPECTED_URL_FORMS}); default: the config's storage.url "
    "(or env CANARYD_STORAGE__URL), else env CANARYD_DATABASE_URL, else the SQLite file "
    "in the data directory."
)
SINCE_HELP = (
    "Start of the window: a duration back from now (90s, 30m, 24h, 7d, 2w) or an ISO time "
    "(no zone means UTC); default 24h."
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help=CONFIG_HELP, show_default=False),
]
UrlOption = Annotated[
    str | None,
    typer.Option("--url", help=URL_HELP, show_default=False),
]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help=SINCE_HELP, show_default=False),
]


def settings_and_url(config: Path | None, url: str | None) -> tuple[Settings, str]:
    """The settings `--config` names (else the default file: `config_path`) and the
    database URL `--url` overrides."""
    settings = load_settings(config)
    return settings, settings.storage.resolved_url(url)
