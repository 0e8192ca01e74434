"""The sections `canaryd switch` reads — storage, the switch with its hooks, and logging
(configured if it logs) — and the base every section shares (`Section`).

Light at import (pydantic and the standard library): the kill switch validates these
sections alone (`canaryd.config.load_switch_settings`) without building the whole
`Settings`, whose other sections import the engines' configuration. `Settings` holds these
very classes, so both read them alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from canaryd import paths
from engine.bounds import check_bounds

__all__ = [
    "CONFIG_ENV",
    "DATABASE_URL_ENV",
    "REVISION_PATTERN",
    "AlertmanagerConfig",
    "CommandHookConfig",
    "LoggingConfig",
    "Section",
    "StorageConfig",
    "SwitchConfig",
    "WebhookConfig",
]

CONFIG_ENV = "CANARYD_CONFIG"
DATABASE_URL_ENV = "CANARYD_DATABASE_URL"
# A revision names what a speculative arm serves: 1 to 128 printable ASCII characters
# without spaces (a pod-template hash, a Flagger checksum, a git sha, an image digest).
REVISION_PATTERN = r"^[!-~]{1,128}$"


class Section(BaseModel):
    """What every section is: unknown keys and non-finite numbers refused, durations and
    counts bounded (`engine.bounds`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    _bounded = field_validator("*")(check_bounds)


class StorageConfig(Section):
    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; unset: env CANARYD_DATABASE_URL, else "
        "sqlite:///$CANARYD_DATA_DIR/canaryd.db. "
        "PostgreSQL: postgresql+psycopg://user:password@host/db",
    )

    buffer_pairs: int = Field(
        default=1000,
        ge=1,
        # Each pair holds both outputs' text and token ids (tens of kB at max_tokens):
        # the bound keeps a long outage from growing the daemon without limit.
        le=100_000,
        description="pairs kept in memory while the database is unreachable; when full, "
        "the oldest is dropped and counted",
    )
    raw_retention_days: float = Field(
        default=30.0, gt=0, description="raw pairs older than this are rolled up and removed"
    )
    rollup_retention_days: float = Field(
        default=365.0, gt=0, description="per-hour roll-ups older than this are removed"
    )

    @model_validator(mode="after")
    def _rollups_outlive_raw_rows(self) -> StorageConfig:
        if self.rollup_retention_days < self.raw_retention_days:
            raise ValueError("rollup_retention_days must be at least raw_retention_days")
        return self

    def resolved_url(self, explicit: str | None = None) -> str:
        """The database every command, the daemon and the gates use: `explicit` (a
        command's `--url`), else `storage.url` (the config file, or CANARYD_STORAGE__URL),
        else env CANARYD_DATABASE_URL, else the SQLite file in the data directory."""
        return (
            explicit or self.url or os.environ.get(DATABASE_URL_ENV) or paths.default_database_url()
        )


class LoggingConfig(Section):
    level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    format: str = Field(
        default="auto",
        pattern="^(auto|json|console)$",
        description="auto: JSON under systemd/journald or when stderr is not a "
        "terminal, console on a terminal",
    )
    include_text: bool = Field(
        default=False, description="log prompt and output text (may be sensitive)"
    )


class _Retried(Section):
    """How an actuator retries: `retries` more attempts after the first, waiting
    `backoff_s`, then twice that, and so on."""

    timeout_s: float = Field(default=10.0, gt=0, description="per attempt")
    retries: int = Field(default=2, ge=0, le=10, description="attempts after the first")
    backoff_s: float = Field(default=1.0, ge=0, description="first wait; doubles each retry")


class CommandHookConfig(_Retried):
    """A command run after every switch change, with the state in CANARYD_SWITCH_* env."""

    argv: list[str] = Field(min_length=1, description="program and arguments (no shell)")


class WebhookConfig(_Retried):
    """POST of the state object as JSON, signed with HMAC-SHA256 when a secret is set."""

    url: str = Field(description="http(s) URL that receives the POST")
    secret: SecretStr | None = Field(default=None, description="shared HMAC secret")
    secret_env: str | None = Field(default=None, description="environment variable to read")
    secret_file: Path | None = Field(default=None, description="file whose content is the secret")
    retries: int = Field(default=3, ge=0, le=10, description="attempts after the first")
    backoff_s: float = Field(default=0.5, ge=0, description="first wait; doubles each retry")

    @model_validator(mode="after")
    def _one_secret_source(self) -> WebhookConfig:
        sources = [self.secret is not None, bool(self.secret_env), self.secret_file is not None]
        if sum(sources) > 1:
            raise ValueError("set at most one of secret, secret_env, secret_file")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        return self


class AlertmanagerConfig(_Retried):
    """Alerts pushed to Alertmanager's API v2 while the switch is rolled back."""

    url: str = Field(description="Alertmanager root, e.g. http://127.0.0.1:9093")
    labels: dict[str, str] = Field(
        default_factory=dict, description="extra labels on the alert (e.g. env, cluster)"
    )
    resend_s: float = Field(
        default=60.0, gt=0, description="re-push interval while rolled back (keeps it firing)"
    )

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {url!r}")
        return url.rstrip("/")


class SwitchConfig(Section):
    """The rollback switch's mirror for production and its optional actuators."""

    state_file: Path | None = Field(
        default=None,
        description="JSON file production reads; default $CANARYD_DATA_DIR/switch.json",
    )
    arm: str | None = Field(
        default=None,
        description="the speculative arm whose rollback the switch controls; the other "
        "speculative arms are comparison arms (measured, gated and reported, never "
        "switching). Unset: the only speculative arm (required when there are several)",
    )
    revision: str | None = Field(
        default=None,
        pattern=REVISION_PATTERN,
        description="the revision the switch's arm serves (a pod-template hash, a Flagger "
        "checksum, a git sha): /v1/verdict and the Flagger webhooks answer NODATA for any "
        "other. Unset: a request that names a revision never named before declares that "
        "the arm now serves it",
    )
    command: CommandHookConfig | None = None
    webhook: WebhookConfig | None = None
    alertmanager: AlertmanagerConfig | None = None

    def resolved_state_file(self) -> Path:
        """The state file every command, the daemon and the gates write: `state_file`
        (the config file, or CANARYD_SWITCH__STATE_FILE), else `switch.json` in the data
        directory."""
        return (self.state_file or paths.data_dir() / "switch.json").expanduser()
