"""canaryd's one configuration model: a TOML file plus `CANARYD_` environment overrides.

`load_settings(path)` reads the file named by `--config` or `CANARYD_CONFIG`, else
`/etc/canaryd/canaryd.toml` when it exists (none: all defaults, which run the embedded
model on both arms), so that an operator's command and the service read the same file
without being told; it applies environment overrides
(`CANARYD_STORAGE__URL=...`, `__` for nesting) and validates everything at once. A bad
file fails with the file, the key and the reason (`ConfigError`).

The sections live in `sections`, the `Settings` model in `settings`, the generated reference
in `docs` (`python -m canaryd.config.docs`); this module finds and loads the file.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from canaryd.config.sections import (
    ARM_NAME_PATTERN,
    CONFIG_ENV,
    DATABASE_URL_ENV,
    REVISION_PATTERN,
    SECRETS_REQUIRED,
    AlertmanagerConfig,
    ArmsConfig,
    CommandHookConfig,
    LoggingConfig,
    PromptsConfig,
    RetentionConfig,
    RolloutConfig,
    ScheduleConfig,
    ServerConfig,
    StorageConfig,
    SwitchConfig,
    TrafficConfig,
    WebhookConfig,
)
from canaryd.config.settings import Settings
from canaryd.errors import ConfigError

__all__ = [
    "ARM_NAME_PATTERN",
    "CONFIG_ENV",
    "DATABASE_URL_ENV",
    "DEFAULT_CONFIG_PATH",
    "REVISION_PATTERN",
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
    "TrafficConfig",
    "WebhookConfig",
    "config_path",
    "load_settings",
]

# The file the systemd unit runs with; read by every command that names no other.
DEFAULT_CONFIG_PATH = Path("/etc/canaryd/canaryd.toml")

_TOP_LEVEL_KEYS = set(Settings.model_fields)


def config_path(explicit: Path | None) -> Path | None:
    """`--config`, else `CANARYD_CONFIG` (set but empty: no file), else
    `DEFAULT_CONFIG_PATH` when it exists, else no file (all defaults)."""
    if explicit is not None:
        return explicit
    env = os.environ.get(CONFIG_ENV)
    if env is not None:
        return Path(env) if env else None
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


_ENGINE_TAGS = frozenset({"transformers", "fake", "openai"})


def _key(loc: tuple[int | str, ...]) -> str:
    # Drop the discriminator tag pydantic inserts after an arm's name ("transformers", ...);
    # an arm may itself be called like a tag, so only the one in that place goes.
    parts = [str(p) for p in loc]
    if len(parts) > 2 and parts[0] == "arms" and parts[2] in _ENGINE_TAGS:
        del parts[2]
    return ".".join(parts) or "(top level)"


def load_settings(path: Path | None = None, *, require_secrets: bool = True) -> Settings:
    """Load and validate the configuration; raise `ConfigError` naming file and key.

    `require_secrets=False` is for commands that use no secret (the switch, `status`,
    `gates`, `db`): a secret that the service reads from its EnvironmentFile, such as
    `traffic.hash_key`, may then be missing without failing the load."""
    path = config_path(path)
    data: dict[str, Any] = {}
    source = str(path) if path else "environment (CANARYD_*)"
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(path, "(file)", "no such file") from None
        except OSError as exc:
            raise ConfigError(path, "(file)", f"cannot read: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(path, "(syntax)", str(exc)) from exc
        unknown = sorted(set(data) - _TOP_LEVEL_KEYS)
        if unknown:
            raise ConfigError(
                path,
                unknown[0],
                "unknown section; expected one of " + ", ".join(sorted(_TOP_LEVEL_KEYS)),
            )
    scope = SECRETS_REQUIRED.set(require_secrets)
    try:
        return Settings(**data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        value = (
            f" (got {first['input']!r})"
            if first["type"] != "missing" and not isinstance(first["input"], dict | None)
            else ""
        )
        key = _key(first["loc"])
        variable = _env_variable(key)
        if variable is not None:  # the environment overrides the file: name what to fix
            source = f"environment {variable}"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(source, key, f"{message}{value}{more}") from None
    finally:
        SECRETS_REQUIRED.reset(scope)


def _env_variable(key: str) -> str | None:
    """The `CANARYD_…` variable that set `key`, when one is set (names are not case
    sensitive, as pydantic-settings reads them)."""
    wanted = "CANARYD_" + key.replace(".", "__").upper()
    return next((name for name in os.environ if name.upper() == wanted), None)
