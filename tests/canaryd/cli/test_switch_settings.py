"""The kill switch's light read of the configuration (`load_switch_settings`) sees what the
whole `Settings` sees for the keys it uses — storage, the switch with its hooks and the
switch policy — from the same file and the same `CANARYD_*` variables, and fails with the
same one-line error for those keys; the rest of the file it leaves unvalidated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from canaryd.config import Settings, SwitchSettings, load_settings, load_switch_settings
from canaryd.config.environment import SwitchSettingsFromEnvironment
from canaryd.config.loading import SECTION_NAMES, read_config_file, validated
from canaryd.errors import ConfigError

HOOKS = """
[storage]
url = "sqlite:////var/lib/canaryd/canaryd.db"
buffer_pairs = 50
[switch]
state_file = "/run/canaryd/switch.json"
revision = "abc123"
[switch.command]
argv = ["/usr/local/bin/flip", "--now"]
retries = 4
[switch.webhook]
url = "https://hooks.example/switch"
secret_env = "HOOK_SECRET"
[switch.alertmanager]
url = "http://127.0.0.1:9093/"
labels = { env = "prod" }
[gates.policy]
trip_k = 2
trip_m = 3
[traffic]
listen = "127.0.0.1:0"
"""


@pytest.fixture(autouse=True)
def _no_canaryd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CANARYD_"):
            monkeypatch.delenv(name)


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(text, encoding="utf-8")
    return path


CASES = {
    "defaults": ("", {}),
    "file": (HOOKS, {}),
    "env over defaults": (
        "",
        {
            "CANARYD_STORAGE__URL": "sqlite:////tmp/x.db",
            "CANARYD_SWITCH__STATE_FILE": "/tmp/state.json",
            "CANARYD_GATES__POLICY__TRIP_K": "3",
            "CANARYD_GATES__POLICY__TRIP_M": "4",
        },
    ),
    "env over file": (
        HOOKS,
        {
            "canaryd_storage__url": "sqlite:////tmp/y.db",  # names are not case sensitive
            "CANARYD_SWITCH__COMMAND__ARGV": '["/bin/true"]',
            "CANARYD_SWITCH__WEBHOOK__RETRIES": "1",
            "CANARYD_GATES__POLICY__COOLDOWN_SECONDS": "60",
        },
    ),
    "database url variable": ("", {"CANARYD_DATABASE_URL": "sqlite:////tmp/z.db"}),
}


@pytest.mark.parametrize(("text", "env"), CASES.values(), ids=list(CASES))
def test_the_switch_reads_what_settings_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, env: dict[str, str]
) -> None:
    """Storage, the switch and the switch policy are equal in both reads, under the same
    file and environment."""
    path = _file(tmp_path, text)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    full = load_settings(path, require_secrets=False)
    light = load_switch_settings(path)
    assert light.storage == full.storage
    assert light.storage.resolved_url() == full.storage.resolved_url()
    assert light.switch == full.switch
    assert light.switch.resolved_state_file() == full.switch.resolved_state_file()
    assert light.gates.policy == full.gates.policy
    if text:  # the case's file and variables did reach both reads
        assert light.switch.command is not None
    # Read through pydantic-settings only where a variable may set one of its keys.
    sections = ("CANARYD_STORAGE", "CANARYD_SWITCH", "CANARYD_GATES")
    sets = any(name.upper().startswith(sections) for name in env)
    assert isinstance(light, SwitchSettingsFromEnvironment) == sets


def test_without_variables_the_file_alone_reads_the_same(tmp_path: Path) -> None:
    """No `CANARYD_<SECTION>` variable: the plain read (no pydantic-settings) gives what
    the read under the environment rules gives."""
    path = _file(tmp_path, HOOKS)
    light = load_switch_settings(path)
    assert type(light) is SwitchSettings
    ruled = validated(SwitchSettingsFromEnvironment, path, read_config_file(path))
    assert ruled.model_dump() == light.model_dump()


ERRORS = {
    "no file": (None, {}),
    "not toml": ("[storage\n", {}),
    "unknown section": ("[nonsense]\n", {}),
    "storage bound": ("[storage]\nbuffer_pairs = 0\n", {}),
    "storage cross-check": ("[storage]\nraw_retention_days = 10\nrollup_retention_days = 5\n", {}),
    "unknown switch key": ("[switch]\nstate_fil = 'x'\n", {}),
    "hook": ("[switch.webhook]\nurl = 'ftp://x'\n", {}),
    "policy": ("[gates.policy]\ntrip_k = -1\n", {}),
    "two errors": ("[switch]\nbogus = 1\n[storage]\nbuffer_pairs = 0\n", {}),
    "variable": ("", {"CANARYD_STORAGE__BUFFER_PAIRS": "many"}),
    "variable over file": ("[switch]\nrevision = 'ok'\n", {"CANARYD_SWITCH__REVISION": "a b"}),
}


@pytest.mark.parametrize(("text", "env"), ERRORS.values(), ids=list(ERRORS))
def test_the_switch_fails_as_settings_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str | None, env: dict[str, str]
) -> None:
    """A bad file or variable for the switch's keys: the same `ConfigError`, word for word."""
    path = tmp_path / "absent.toml" if text is None else _file(tmp_path, text)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as full:
        load_settings(path, require_secrets=False)
    with pytest.raises(ConfigError) as light:
        load_switch_settings(path)
    assert str(light.value) == str(full.value)


def test_the_rest_of_the_file_is_not_the_switch_business(tmp_path: Path) -> None:
    """An error in a section the switch does not use stops `Settings`, not the switch."""
    path = _file(tmp_path, '[storage]\nurl = "sqlite:////tmp/a.db"\n[schedule]\nbogus = 1\n')
    with pytest.raises(ConfigError, match=r"schedule\.bogus"):
        load_settings(path, require_secrets=False)
    assert load_switch_settings(path).storage.url == "sqlite:////tmp/a.db"


def test_section_names_are_the_settings_fields() -> None:
    """The sections a file may have (checked without building `Settings`) are its fields."""
    assert set(Settings.model_fields) == SECTION_NAMES
