"""The `CANARYD_` environment rules of canaryd's settings: `EnvironmentSettings`, the
pydantic-settings base of `Settings`, and `SwitchSettingsFromEnvironment`, the kill
switch's sections read under the same rules.

Apart from `canaryd.config.loading` because pydantic-settings is slow to import: the kill
switch imports this module only when a `CANARYD_<SECTION>` variable may change what it
reads; otherwise the file alone decides, as it does here when no such variable is set.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from canaryd.config.loading import SwitchSettings

__all__ = ["EnvironmentSettings", "SwitchSettingsFromEnvironment"]


class EnvironmentSettings(BaseSettings):
    """The rules every settings model reads its sections by: the TOML file's content as
    keyword arguments, each overridden by `CANARYD_<SECTION>__<KEY>` (names not case
    sensitive, `__` for nesting, a nested default updated key by key)."""

    model_config = SettingsConfigDict(
        env_prefix="CANARYD_",
        env_nested_delimiter="__",
        extra="ignore",
        nested_model_default_partial_update=True,
        allow_inf_nan=False,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML file arrives through init_settings (`read_config_file` parses it, so
        # that syntax errors can name their line); the environment overrides the file.
        return env_settings, init_settings


class SwitchSettingsFromEnvironment(EnvironmentSettings, SwitchSettings):
    """`SwitchSettings` with its keys overridden by `CANARYD_` variables as in `Settings`."""

    model_config = EnvironmentSettings.model_config
