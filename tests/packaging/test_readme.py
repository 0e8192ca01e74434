"""README.md against the code it describes: the command table names every command the CLI
has and no other, the exit codes it states are the ones the commands return, the gate
count is the registry's, and the config comment lists every speculative method."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest
from typer.core import TyperGroup

from canaryd.cli import judge as judge_command
from canaryd.cli.app import COMMANDS, load_command
from canaryd.errors import CanarydError
from engine.config import SpeculativeConfig
from engine.errors import EngineError
from gates import GATES

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
NUMBERS = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def cli_commands() -> set[str]:
    """Every runnable command path: `once`, `switch status`, `models list`, ..."""
    found = set()
    for name in COMMANDS:
        command = load_command(name)
        if isinstance(command, TyperGroup):
            found.update(f"{name} {sub}" for sub in command.commands)
        else:
            found.add(name)
    return found


def table_commands() -> set[str]:
    """The command paths of the Commands table's first column. `a|b` alternatives and a
    bare `` `list` `` after ` / ` (the same group's other command) are expanded."""
    found = set()
    for row in section("Commands").splitlines():
        if not row.startswith("| `"):
            continue
        cell = row.split(" | ")[0]
        group: str | None = None
        for code in re.findall(r"`([^`]+)`", cell):
            words = code.replace("\\|", "|").split()
            if words[0] == "canaryd":
                words = [w for w in words[1:] if not w.startswith(("[", "-"))]
                head = words[0]
                if head in COMMANDS and isinstance(load_command(head), TyperGroup):
                    group = head
                    found.update(f"{head} {sub}" for sub in words[1].split("|"))
                else:
                    group = None
                    found.add(head)
            elif group is not None:
                found.add(f"{group} {words[0]}")
    return found


class TestCommandTable:
    def test_every_command_is_in_the_table(self) -> None:
        """Each command the CLI runs has a row (or shares one); the table names nothing
        the CLI lacks."""
        assert table_commands() == cli_commands()


class TestExitCodes:
    def test_judge(self) -> None:
        """The table's and Operations' judge codes are `judge`'s: 0 PASS, 1 FAIL, 3
        undecided by default."""
        undecided = inspect.signature(judge_command.judge).parameters["undecided_exit"].default
        assert judge_command.EXIT_CODES["PASS"] == 0
        assert judge_command.EXIT_CODES["FAIL"] == 1
        assert undecided == 3
        assert "exit 0 PASS, 1 FAIL, 3 undecided (`--undecided-exit N`), 2 error" in README
        operations = " ".join(section("Operations").split())
        assert "1 the command found what it checks for: `judge` FAIL" in operations
        assert "3 `judge` undecided (`--undecided-exit N`)" in operations

    def test_errors_exit_two(self) -> None:
        """A problem for the user to fix exits 2, as Operations says."""
        assert CanarydError.exit_code == 2
        assert EngineError.exit_code == 2
        operations = " ".join(section("Operations").split())
        assert "2 a problem for you to fix" in operations


class TestHowItDecides:
    def test_gate_count(self) -> None:
        """ "N gates judge the stored pairs" counts the registry's gates on pairs."""
        match = re.search(r"(\w+) gates judge the stored pairs", README)
        assert match is not None
        on_pairs = [spec.name for spec in GATES if spec.evidence == "pairs"]
        assert NUMBERS[match.group(1).lower()] == len(on_pairs), on_pairs


class TestConfiguration:
    @pytest.mark.parametrize(
        "method", typing.get_args(SpeculativeConfig.model_fields["method"].annotation)
    )
    def test_config_comment_lists_every_method(self, method: str) -> None:
        """The example's `method` comment names every speculative method."""
        line = next(x for x in section("Configuration").splitlines() if x.startswith("method ="))
        assert method in line
