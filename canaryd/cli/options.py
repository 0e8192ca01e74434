"""The options several commands share, each defined once: `--config/-c`, `--url` and
`--since`, with one help text and one reading (`settings_and_url`, `parse_since`), so
that every command finds the same configuration and the same database; and the two
servers a one-shot command may name instead of the configured arms (`--baseline`,
`--candidate`, `--model`, `--server-kind`: `settings_with_urls`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from canaryd.cli.common import fail
from canaryd.config import (
    DEFAULT_CONFIG_PATH,
    SwitchSettings,
    load_settings,
    load_switch_settings,
)
from canaryd.store import EXPECTED_URL_FORMS

if TYPE_CHECKING:
    from canaryd.config import Settings

__all__ = [
    "CONFIG_HELP",
    "SINCE_HELP",
    "URL_HELP",
    "BaselineOption",
    "CandidateOption",
    "ConfigOption",
    "ModelOption",
    "ServerKindOption",
    "SinceOption",
    "UrlOption",
    "settings_and_url",
    "settings_with_urls",
    "switch_settings_and_url",
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
    database URL `--url` overrides, for a command that reads the database and uses no
    secret (a missing `traffic.hash_key` does not stop it: `load_settings`)."""
    settings = load_settings(config, require_secrets=False)
    return settings, settings.storage.resolved_url(url)


def switch_settings_and_url(config: Path | None, url: str | None) -> tuple[SwitchSettings, str]:
    """`settings_and_url` for the switch commands: the sections they use
    (`load_switch_settings`), the rest of the file unvalidated."""
    settings = load_switch_settings(config)
    return settings, settings.storage.resolved_url(url)


# --- two servers named on the command line instead of the config's arms -------------

BaselineOption = Annotated[
    str | None, typer.Option("--baseline", help="baseline server root (plain decoding)")
]
CandidateOption = Annotated[
    str | None,
    typer.Option("--candidate", help="candidate server root (speculative decoding)"),
]
ModelOption = Annotated[
    str,
    typer.Option("--model", help="the `model` both servers are asked for (with the URLs)"),
]
ServerKind = Literal["vllm", "sglang", "tgi", "llamacpp", "generic"]
ServerKindOption = Annotated[
    ServerKind,
    typer.Option(
        "--server-kind",
        help="what serves both URLs: how acceptance is read (vllm: per request, else "
        "/metrics) and whether the baseline can score outputs (vllm)",
    ),
]


def settings_with_urls(
    settings: Settings,
    baseline: str | None,
    candidate: str | None,
    model: str,
    server_kind: ServerKind = "generic",
) -> Settings:
    """`settings` whose arms are the two URLs serving `model` (both given), else the
    configured arms."""
    from canaryd.config import ArmsConfig  # the engines' configuration: only when named

    if baseline is None and candidate is None:
        return settings
    if baseline is None or candidate is None:
        raise fail("give both --baseline and --candidate, or neither (arms from --config)")
    for option, url in (("--baseline", baseline), ("--candidate", candidate)):
        if not url.startswith(("http://", "https://")):
            raise fail(f"{option} {url!r}: expected an http:// or https:// URL (no /v1)")
    candidate = candidate.rstrip("/")
    speculative: dict[str, object] = {
        "kind": "openai",
        "base_url": candidate,
        "model": model,
        "speculative": True,
        "server_kind": server_kind,
    }
    if server_kind in ("vllm", "tgi"):  # acceptance around a request when not per request
        speculative["metrics_url"] = f"{candidate}/metrics"
    arms = ArmsConfig.model_validate(
        {
            "baseline": {
                "kind": "openai",
                "base_url": baseline.rstrip("/"),
                "model": model,
                "server_kind": server_kind,
            },
            "speculative": speculative,
        }
    )
    switch = settings.switch.model_copy(update={"arm": None})
    return settings.model_copy(update={"arms": arms, "switch": switch})
