"""`canaryd switch`, `canaryd gates` and `canaryd audit` through the CLI runner, with no
daemon running: exit codes and the messages a person reads."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.switch import read_state_file

Cli = tuple[CliRunner, list[str], dict[str, str], Path]


@pytest.fixture
def cli(database_url: str, tmp_path: Path) -> Cli:
    """A runner, `--url` for a fresh database, an env naming a state file, that file."""
    state_file = tmp_path / "state" / "switch.json"
    env = {"CANARYD_SWITCH__STATE_FILE": str(state_file), "CANARYD_CONFIG": ""}
    return CliRunner(), ["--url", database_url], env, state_file


class TestKillSwitch:
    def test_rollback_without_a_daemon_writes_database_and_file(self, cli: Cli) -> None:
        """`switch rollback` on a fresh database records the user and writes the file."""
        runner, url, env, state_file = cli
        result = runner.invoke(app, ["switch", "rollback", "--reason", "pager", *url], env=env)
        assert result.exit_code == 0, result.output
        assert "switch rolled back: mode=rolled_back" in result.output
        data = read_state_file(state_file)
        assert data is not None
        assert data["actor"] == f"user:{getpass.getuser()}" and data["reason"] == "pager"
        shown = runner.invoke(app, ["switch", "status", "--json", *url], env=env)
        assert shown.exit_code == 0
        assert json.loads(shown.output) == data

    def test_a_second_rollback_changes_nothing(self, cli: Cli) -> None:
        """Rolling back a manually rolled-back switch keeps its generation."""
        runner, url, env, state_file = cli
        runner.invoke(app, ["switch", "rollback", "--reason", "a", *url], env=env)
        again = runner.invoke(app, ["switch", "rollback", "--reason", "b", *url], env=env)
        assert again.exit_code == 0
        assert "switch unchanged" in again.output
        assert read_state_file(state_file)["generation"] == 1  # type: ignore[index]

    def test_forced_restore_is_recorded_as_forced(self, cli: Cli) -> None:
        """Without gate evidence a restore is refused (exit 1) unless forced, and the
        forced one says so in the audit trail."""
        runner, url, env, _ = cli
        runner.invoke(app, ["switch", "rollback", "--reason", "a", *url], env=env)
        refused = runner.invoke(app, ["switch", "restore", "--reason", "b", *url], env=env)
        assert refused.exit_code == 1
        assert "no gate evaluation" in refused.output
        forced = runner.invoke(
            app, ["switch", "restore", "--reason", "b", "--force", *url], env=env
        )
        assert forced.exit_code == 0, forced.output
        trail = runner.invoke(app, ["audit", "--since", "1h", "--json", *url], env=env)
        entries = json.loads(trail.output)
        assert [e["kind"] for e in entries] == ["transition", "refused", "transition"]
        assert entries[-1]["reason"].startswith("FORCED")

    def test_auto_hands_control_back_to_the_gates(self, cli: Cli) -> None:
        """`switch auto` after a manual rollback keeps the mode and gives control to gates."""
        runner, url, env, state_file = cli
        runner.invoke(app, ["switch", "rollback", "--reason", "a", *url], env=env)
        result = runner.invoke(app, ["switch", "auto", *url], env=env)
        assert result.exit_code == 0, result.output
        data = read_state_file(state_file)
        assert data is not None and data["control"] == "gates" and data["mode"] == "rolled_back"


class TestReadCommands:
    def test_gates_without_evaluations_says_so(self, cli: Cli) -> None:
        """`canaryd gates` on a database the daemon never gated explains what is missing."""
        runner, url, env, _ = cli
        runner.invoke(app, ["switch", "rollback", "--reason", "a", *url], env=env)
        result = runner.invoke(app, ["gates", *url], env=env)
        assert result.exit_code == 0
        assert "no gate decisions recorded yet" in result.output
        as_json = runner.invoke(app, ["gates", "--json", *url], env=env)
        assert json.loads(as_json.output) == {"evaluated_at": None, "gates": []}

    def test_audit_rejects_a_bad_since(self, cli: Cli) -> None:
        """A --since that is neither a duration nor an ISO time is exit 2 with the forms."""
        runner, url, env, _ = cli
        result = runner.invoke(app, ["audit", "--since", "yesterday", *url], env=env)
        assert result.exit_code == 2
        assert "expected a duration" in result.output

    def test_status_on_a_missing_database_is_one_line(self, tmp_path: Path) -> None:
        """`switch status` on a missing SQLite file says how to create it, exit 2."""
        url = f"sqlite:///{tmp_path / 'absent.db'}"
        result = CliRunner().invoke(app, ["switch", "status", "--url", url])
        assert result.exit_code == 2
        assert "canaryd db upgrade" in result.output
