"""`canaryd switch`, `canaryd gates` and `canaryd audit` through the CLI runner, with no
daemon running: exit codes and the messages a person reads, with the database up and with
it unreachable (a PostgreSQL port nobody listens on, a SQLite file that cannot be made)."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.switch import read_state_file

Cli = tuple[CliRunner, list[str], dict[str, str], Path]
Down = tuple[CliRunner, list[str], dict[str, str], Path]


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


@pytest.fixture(params=["postgresql", "sqlite"])
def down(request: pytest.FixtureRequest, tmp_path: Path) -> Down:
    """A runner, `--url` for a database that cannot be reached, an env naming a state
    file, that file: PostgreSQL on a closed loopback port, or SQLite under a regular file."""
    if request.param == "postgresql":
        url = "postgresql+psycopg://canaryd:canaryd@127.0.0.1:1/canaryd"
    else:
        blocker = tmp_path / "not-a-directory"
        blocker.write_text("")
        url = f"sqlite:///{blocker / 'canaryd.db'}"
    state_file = tmp_path / "state" / "switch.json"
    env = {"CANARYD_SWITCH__STATE_FILE": str(state_file), "CANARYD_CONFIG": ""}
    return CliRunner(), ["--url", url], env, state_file


class TestKillSwitchWithoutDatabase:
    def test_rollback_writes_the_state_file_alone_and_exits_0(self, down: Down) -> None:
        """With the database unreachable, `switch rollback` writes a pending emergency
        rollback to the state file, says so, and exits 0."""
        runner, url, env, state_file = down
        result = runner.invoke(app, ["switch", "rollback", "--reason", "INC-5", *url], env=env)
        assert result.exit_code == 0, result.output
        assert "the database is unreachable" in result.output
        assert "IN THE STATE FILE ONLY" in result.output
        assert "to be synced" in result.output
        data = read_state_file(state_file)
        assert data is not None
        assert data["mode"] == "rolled_back" and data["speculative_enabled"] is False
        assert data["control"] == "manual" and data["actor"] == f"user:{getpass.getuser()}"
        assert data["reason"] == "EMERGENCY (database unreachable): INC-5"
        assert data["generation"] == 1 and data["pending_sync"] is True

    @pytest.mark.parametrize("command", [["restore", "--force"], ["auto"]])
    def test_restore_and_auto_are_refused(self, down: Down, command: list[str]) -> None:
        """`switch restore` (even forced) and `switch auto` refuse without the database,
        in one line, and leave the emergency file as it is."""
        runner, url, env, state_file = down
        runner.invoke(app, ["switch", "rollback", "--reason", "INC-5", *url], env=env)
        before = state_file.read_bytes()
        result = runner.invoke(app, ["switch", *command, "--reason", "x", *url], env=env)
        assert result.exit_code == 2
        assert f"switch {command[0]} refused: the database is unreachable" in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert state_file.read_bytes() == before

    def test_an_unwritable_state_file_fails_the_rollback(self, down: Down, tmp_path: Path) -> None:
        """When the state file cannot be written either, the rollback exits 2 and says that
        speculative decoding is not rolled back."""
        runner, url, env, _ = down
        blocker = tmp_path / "file-not-dir"
        blocker.write_text("")
        env = {**env, "CANARYD_SWITCH__STATE_FILE": str(blocker / "switch.json")}
        result = runner.invoke(app, ["switch", "rollback", "--reason", "INC-5", *url], env=env)
        assert result.exit_code == 2
        assert "could not be written either" in result.output
        assert "NOT rolled back" in result.output

    def test_the_database_adopts_it_once_reachable(self, down: Down, database_url: str) -> None:
        """Back on a reachable database, `switch status` syncs the emergency rollback: in
        sync, pending_sync gone, an audit row noting the sync; a later rollback is a no-op."""
        runner, offline, env, state_file = down
        runner.invoke(app, ["switch", "rollback", "--reason", "INC-5", *offline], env=env)
        url = ["--url", database_url]
        runner.invoke(app, ["db", "upgrade", *url], env=env)
        shown = runner.invoke(app, ["switch", "status", *url], env=env)
        assert shown.exit_code == 0, shown.output
        assert "synced the state file's emergency rolled_back (generation 1" in shown.output
        assert "(in sync)" in shown.output and "EMERGENCY" in shown.output
        data = read_state_file(state_file)
        assert data is not None and "pending_sync" not in data and data["generation"] == 1
        trail = json.loads(runner.invoke(app, ["audit", "--json", *url], env=env).output)
        assert [e["generation"] for e in trail] == [1]
        assert "synced from state file after database outage" in trail[0]["reason"]
        again = runner.invoke(app, ["switch", "rollback", "--reason", "INC-5", *url], env=env)
        assert again.exit_code == 0 and "switch unchanged" in again.output

    def test_a_command_on_the_reachable_database_adopts_first(
        self, down: Down, database_url: str
    ) -> None:
        """A forced restore after the outage first syncs the emergency rollback, then
        restores one generation above it."""
        runner, offline, env, state_file = down
        runner.invoke(app, ["switch", "rollback", "--reason", "INC-5", *offline], env=env)
        url = ["--url", database_url]
        runner.invoke(app, ["db", "upgrade", *url], env=env)
        result = runner.invoke(
            app, ["switch", "restore", "--force", "--reason", "db back", *url], env=env
        )
        assert result.exit_code == 0, result.output
        assert "synced the state file's emergency rolled_back" in result.output
        assert "switch restored: mode=auto" in result.output
        data = read_state_file(state_file)
        assert data is not None and data["generation"] == 2 and data["speculative_enabled"]
