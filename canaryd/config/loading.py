"""Reading the configuration: a file's TOML (`read_config_file`), a failed validation
turned into the one-line `ConfigError` naming file or variable and key (`validated`), and
`SwitchSettings`, the sections the kill switch uses (storage, the switch with its hooks,
the switch policy).

`canaryd.config.load_settings` builds the whole `Settings` with these;
`load_switch_settings` builds `SwitchSettings` from the same file with the same section
classes, without importing the other sections (the engines' configuration, telemetry, the
gates'), so that `canaryd switch` starts fast and runs whatever is wrong elsewhere. Only
when a `CANARYD_` variable may set one of its keys (`environment_sets`) does it read them
through pydantic-settings under `Settings`' very rules (`canaryd.config.environment`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from canaryd.config.switching import StorageConfig, SwitchConfig
from canaryd.errors import ConfigError
from gates.switch.config import SwitchPolicyConfig

__all__ = [
    "SECTION_NAMES",
    "SwitchSettings",
    "environment_sets",
    "read_config_file",
    "validated",
]

# The sections a config file may have: the fields of `Settings` (a test keeps them equal).
SECTION_NAMES = frozenset(
    {
        "arms",
        "gates",
        "logging",
        "prompts",
        "retention",
        "rollout",
        "schedule",
        "server",
        "storage",
        "switch",
        "telemetry",
        "traffic",
    }
)

_ENGINE_TAGS = frozenset({"transformers", "fake", "openai"})

M = TypeVar("M", bound=BaseModel)


class _SwitchGates(BaseModel):
    """`[gates]` as the switch reads it: the policy alone (the gates' own sections are the
    gates' business)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    policy: SwitchPolicyConfig = SwitchPolicyConfig()


class SwitchSettings(BaseModel):
    """What `canaryd switch` reads of the configuration: `storage`, `switch` and
    `gates.policy`, the very section classes of `Settings`; the other sections are not
    validated (a command validates only what it uses)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    storage: StorageConfig = Field(default_factory=StorageConfig)
    switch: SwitchConfig = Field(default_factory=SwitchConfig)
    gates: _SwitchGates = Field(default_factory=_SwitchGates)


def environment_sets(model: type[BaseModel]) -> bool:
    """Whether a `CANARYD_<SECTION>…` variable may set a key of one of `model`'s sections
    (names are not case sensitive)."""
    prefixes = tuple(f"CANARYD_{name.upper()}" for name in model.model_fields)
    return any(name.upper().startswith(prefixes) for name in os.environ)


def read_config_file(path: Path | None) -> dict[str, Any]:
    """The TOML of `path` (None: no file, nothing); `ConfigError` for a file that is
    missing, unreadable, not TOML, or has a section canaryd does not know."""
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(path, "(file)", "no such file") from None
    except OSError as exc:
        raise ConfigError(path, "(file)", f"cannot read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "(syntax)", str(exc)) from exc
    unknown = sorted(set(data) - SECTION_NAMES)
    if unknown:
        raise ConfigError(
            path,
            unknown[0],
            "unknown section; expected one of " + ", ".join(sorted(SECTION_NAMES)),
        )
    return data


def validated(build: Callable[..., M], path: Path | None, data: dict[str, Any]) -> M:
    """`build(**data)`; its first validation error as `ConfigError` naming the file (or the
    `CANARYD_…` variable that set the key) and the key."""
    try:
        return build(**data)
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
        source = str(path) if path else "environment (CANARYD_*)"
        if variable is not None:  # the environment overrides the file: name what to fix
            source = f"environment {variable}"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(source, key, f"{message}{value}{more}") from None


def _key(loc: tuple[int | str, ...]) -> str:
    # Drop the discriminator tag pydantic inserts after an arm's name ("transformers", ...);
    # an arm may itself be called like a tag, so only the one in that place goes.
    parts = [str(p) for p in loc]
    if len(parts) > 2 and parts[0] == "arms" and parts[2] in _ENGINE_TAGS:
        del parts[2]
    return ".".join(parts) or "(top level)"


def _env_variable(key: str) -> str | None:
    """The `CANARYD_…` variable that set `key`, when one is set (names are not case
    sensitive, as pydantic-settings reads them)."""
    wanted = "CANARYD_" + key.replace(".", "__").upper()
    return next((name for name in os.environ if name.upper() == wanted), None)
