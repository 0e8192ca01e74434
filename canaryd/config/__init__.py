"""canaryd's one configuration model: a TOML file plus `CANARYD_` environment overrides.

`load_settings(path)` reads the file named by `--config` or `CANARYD_CONFIG`, else
`/etc/canaryd/canaryd.toml` when it exists (none: all defaults, which run the embedded
model on both arms), so that an operator's command and the service read the same file
without being told; it applies environment overrides
(`CANARYD_STORAGE__URL=...`, `__` for nesting) and validates everything at once. A bad
file fails with the file, the key and the reason (`ConfigError`). `load_switch_settings`
reads, the same way, only the sections the kill switch uses.

The sections live in `sections` (storage's, the switch's and logging's in `switching`),
the `Settings` model in `settings`, the reading of a file and the environment in
`loading`, the generated reference in `docs` (`python -m canaryd.config.docs`), the key
of the arms' configuration that evidence is stored under in `arms`. The names below are
imported on first use (PEP 562), each from the module its TYPE_CHECKING import names
(`engine.lazy`): the kill switch reads its sections without importing the others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from canaryd.config.loading import (
    SwitchSettings,
    environment_sets,
    read_config_file,
    validated,
)
from canaryd.config.switching import (
    CONFIG_ENV,
    DATABASE_URL_ENV,
    REVISION_PATTERN,
    AlertmanagerConfig,
    CommandHookConfig,
    LoggingConfig,
    StorageConfig,
    SwitchConfig,
    WebhookConfig,
)
from engine.lazy import lazy_exports

if TYPE_CHECKING:
    from canaryd.config.sections import (
        ARM_NAME_PATTERN,
        SECRETS_REQUIRED,
        ArmsConfig,
        PromptsConfig,
        RetentionConfig,
        RolloutConfig,
        ScheduleConfig,
        ServerConfig,
        TrafficConfig,
    )
    from canaryd.config.settings import Settings

__getattr__, __dir__ = lazy_exports(globals())

# The file the systemd unit runs with; read by every command that names no other.
DEFAULT_CONFIG_PATH = Path("/etc/canaryd/canaryd.toml")


def config_path(explicit: Path | None) -> Path | None:
    """`--config`, else `CANARYD_CONFIG` (set but empty: no file), else
    `DEFAULT_CONFIG_PATH` when it exists, else no file (all defaults)."""
    if explicit is not None:
        return explicit
    env = os.environ.get(CONFIG_ENV)
    if env is not None:
        return Path(env) if env else None
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


def load_settings(path: Path | None = None, *, require_secrets: bool = True) -> Settings:
    """Load and validate the configuration; raise `ConfigError` naming file and key.

    `require_secrets=False` is for commands that use no secret (the switch, `status`,
    `gates`, `db`): a secret that the service reads from its EnvironmentFile, such as
    `traffic.hash_key`, may then be missing without failing the load."""
    from canaryd.config.sections import SECRETS_REQUIRED  # the whole Settings: on demand
    from canaryd.config.settings import Settings

    path = config_path(path)
    data = read_config_file(path)
    scope = SECRETS_REQUIRED.set(require_secrets)
    try:
        return validated(Settings, path, data)
    finally:
        SECRETS_REQUIRED.reset(scope)


def load_switch_settings(path: Path | None = None) -> SwitchSettings:
    """The sections the switch uses, read as `load_settings` reads them (same file, same
    environment, same errors for these keys), the rest of the file unvalidated."""
    path = config_path(path)
    data = read_config_file(path)
    if not environment_sets(SwitchSettings):
        return validated(SwitchSettings, path, data)
    from canaryd.config.environment import SwitchSettingsFromEnvironment  # pydantic-settings

    return validated(SwitchSettingsFromEnvironment, path, data)


__all__ = [
    "ARM_NAME_PATTERN",
    "CONFIG_ENV",
    "DATABASE_URL_ENV",
    "DEFAULT_CONFIG_PATH",
    "REVISION_PATTERN",
    "SECRETS_REQUIRED",
    "AlertmanagerConfig",
    "ArmsConfig",
    "CommandHookConfig",
    "LoggingConfig",
    "PromptsConfig",
    "RetentionConfig",
    "RolloutConfig",
    "ScheduleConfig",
    "ServerConfig",
    "Settings",
    "StorageConfig",
    "SwitchConfig",
    "SwitchSettings",
    "TrafficConfig",
    "WebhookConfig",
    "config_path",
    "load_settings",
    "load_switch_settings",
]
