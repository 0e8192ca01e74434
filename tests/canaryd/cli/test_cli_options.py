"""`--config`, `--url` and `--since` are defined once: every command that takes one has the
same flags and the very same help text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.core import TyperCommand, TyperGroup, TyperOption

from canaryd.cli import options
from canaryd.cli.app import COMMANDS, load_command

SHARED = {
    "config": (options.CONFIG_HELP, ["--config", "-c"]),
    "url": (options.URL_HELP, ["--url"]),
    "since": (options.SINCE_HELP, ["--since"]),
}
EXPECTED = {
    "config": {
        "run", "once", "bench", "judge", "probe", "calibrate", "report", "status", "gates", "audit",
        "switch status", "switch rollback", "switch restore", "switch auto",
        "switch nginx-map", "db upgrade", "db current", "db repin",
    },
    "url": {
        "report", "status", "gates", "audit",
        "switch status", "switch rollback", "switch restore", "switch auto",
        "db upgrade", "db current", "db repin",
    },
    "since": {"report", "audit"},
}  # fmt: skip


def commands(group: dict[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    for name, command in group.items():
        if isinstance(command, TyperGroup):
            yield from commands(dict(command.commands), f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


ALL = dict(commands({name: load_command(name) for name in COMMANDS}))


@pytest.mark.parametrize("option", sorted(SHARED))
def test_every_command_shares_one_definition(option: str) -> None:
    """Each command taking the option declares the same flags with the same help object."""
    help_text, flags = SHARED[option]
    taking = {}
    for name, command in ALL.items():
        assert isinstance(command, TyperCommand), name
        for param in command.params:
            if param.name == option:
                taking[name] = param
    assert set(taking) == EXPECTED[option]
    for name, param in taking.items():
        assert isinstance(param, TyperOption), name
        assert param.help is help_text, name
        assert param.opts == flags, name
        assert param.default is None, name
