"""`canaryd switch`, `canaryd gates` and `canaryd audit` through the CLI runner, with no
daemon running: exit codes and the messages a person reads, with the database up and with
it unreachable (a PostgreSQL port nobody listens on, a SQLite file that cannot be made)."""

from __future__ import annotations

import getpass
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner, Result

from canaryd import config as config_module
from canaryd.cli.app import app
from canaryd.store import SqlStore, mask_url
from canaryd.switch import read_state_file, without_freshness

Cli = tuple[CliRunner, list[str], dict[str, str], Path]
Down = tuple[CliRunner, list[str], dict[str, str], Path]


@pytest.fixture
def cli(database_url: str, tmp_path: Path) -> Cli:
    """A runner, `--url` for a migrated empty database (as the daemon leaves it), an env
    naming a state file, that file."""
    state_file = tmp_path / "state" / "switch.json"
    env = {"CANARYD_SWITCH__STATE_FILE": str(state_file), "CANARYD_CONFIG": ""}
    runner = CliRunner()
    upgraded = runner.invoke(app, ["db", "upgrade", "--url", database_url], env=env)
    assert upgraded.exit_code == 0, upgraded.output
    return runner, ["--url", database_url], env, state_file


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
        assert json.loads(shown.stdout) == without_freshness(data)
        assert "confirmed_at" in data

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

    def test_restore_clears_the_latched_fail_of_the_revision_being_judged(
        self, cli: Cli, database_url: str
    ) -> None:
        """A restore with a reason (speculation on: nothing to refuse) clears the FAIL a
        rollout tool's revision latched, says so, and records who and why; a rollback
        latches nothing by itself (the verdict reads the switch's rollback)."""
        runner, url, env, _ = cli
        now = datetime.now(UTC)
        with SqlStore.open(database_url) as store:
            store.start_revision("speculative", "rev", now - timedelta(minutes=5))
            store.latch_revision("speculative", "rev", now - timedelta(minutes=1), "error FAIL")
        result = runner.invoke(app, ["switch", "restore", "--reason", "draft fixed", *url], env=env)
        assert result.exit_code == 0, result.output
        assert (
            "revision 'rev' of speculative: its FAIL cleared (error FAIL); its evidence "
            "restarts now"
        ) in result.output
        with SqlStore.open(database_url) as store:
            window = store.revision_window("speculative", "rev")
        assert window is not None and window.failed_at is None
        assert window.restore == f"user:{getpass.getuser()}: draft fixed"
        assert window.restored_at is not None and window.restored_at >= now


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Makes a directory immutable (`chattr +i`: even root cannot write in it, as on a
    read-only mount), undone after the test; skips where the filesystem has no such flag."""
    frozen: list[Path] = []

    def freeze(directory: Path) -> None:
        done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"chattr +i is not available here: {done.stderr.decode().strip()}")
        frozen.append(directory)

    yield freeze
    for directory in frozen:
        subprocess.run(["chattr", "-i", str(directory)], check=False)


class TestStateFileNotWritten:
    def test_the_message_says_production_still_reads_the_old_state(
        self, cli: Cli, immutable: Callable[[Path], None]
    ) -> None:
        """The database takes the rollback but the state file cannot be written: exit 1,
        and the message says production still reads the old file, speculation still on."""
        runner, url, env, state_file = cli
        assert runner.invoke(app, ["switch", "auto", *url], env=env).exit_code == 0
        immutable(state_file.parent)
        result = runner.invoke(app, ["switch", "rollback", "--reason", "p99", *url], env=env)
        assert result.exit_code == 1
        assert "the database holds generation 1, but the state file" in result.stderr
        assert "production still reads the old state (generation 0" in result.stderr
        assert "speculation is still ON" in result.stderr
        assert read_state_file(state_file)["speculative_enabled"] is True  # type: ignore[index]


class TestStateFileLockHeld:
    def test_the_kill_switch_finishes_in_seconds_and_says_what_it_did(self, cli: Cli) -> None:
        """Another process holds the state file's lock (a frozen writer): `switch rollback`
        commits the database, gives up on the file after the lock wait, and says that
        production still reads the old state; it never blocks."""
        runner, url, env, state_file = cli
        assert runner.invoke(app, ["switch", "auto", *url], env=env).exit_code == 0
        lock = state_file.with_name(f".{state_file.name}.lock")
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import fcntl, os, sys, time\n"
             f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
             "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)"],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            started = time.monotonic()
            result = runner.invoke(app, ["switch", "rollback", "--reason", "INC", *url], env=env)
            took = time.monotonic() - started
        finally:
            holder.kill()
            holder.wait()
        assert took < 15, took
        assert result.exit_code == 1
        assert "switch rolled back: mode=rolled_back" in result.output
        assert "held the lock" in result.stderr and "production still reads" in result.stderr
        assert "space, permissions" not in result.stderr and "fuser" in result.stderr
        shown = runner.invoke(app, ["switch", "status", "--json", *url], env=env)
        assert json.loads(shown.stdout)["mode"] == "rolled_back"


class TestReadCommands:
    def test_gates_without_evaluations_says_so(self, cli: Cli) -> None:
        """`canaryd gates` on a database the daemon never gated explains what is missing."""
        runner, url, env, _ = cli
        runner.invoke(app, ["switch", "rollback", "--reason", "a", *url], env=env)
        result = runner.invoke(app, ["gates", *url], env=env)
        assert result.exit_code == 0
        assert "no gate decisions recorded yet" in result.output
        as_json = runner.invoke(app, ["gates", "--json", *url], env=env)
        assert json.loads(as_json.output) == {
            "evaluated_at": None,
            "gates": [],
            "arm": "speculative",
            "comparison_arms": {},
        }

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
        assert data["reason"] == "EMERGENCY (database not updated): INC-5"
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


def _no_canaryd_env(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    """An operator's shell: none of the service's CANARYD_* variables, its own data dir."""
    for name in (
        "CANARYD_CONFIG",
        "CANARYD_STORAGE__URL",
        "CANARYD_DATABASE_URL",
        "CANARYD_SWITCH__STATE_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CANARYD_DATA_DIR", str(data_dir))


def _write_toml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


class TestSameSettingsAsTheService:
    """The operator's command finds the service's database and state file by itself:
    both live in the conventional config file, read when no other is named."""

    def test_without_config_the_default_file_names_database_and_state_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No --config and no CANARYD_*: the default config file's storage.url and
        state_file are used (and printed); the data directory gets no database."""
        db = tmp_path / "var" / "canaryd.db"
        state_file = tmp_path / "run" / "switch.json"
        config = _write_toml(
            tmp_path / "etc" / "canaryd.toml",
            f'[storage]\nurl = "sqlite:///{db}"\n[switch]\nstate_file = "{state_file}"\n',
        )
        monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", config)
        _no_canaryd_env(monkeypatch, tmp_path / "data")
        runner = CliRunner()
        assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
        result = runner.invoke(app, ["switch", "rollback", "--reason", "INC-1"])
        assert result.exit_code == 0, result.output
        assert f"config: {config}\n" in result.stdout
        assert f"database: sqlite:///{db}\n" in result.stdout
        assert f"state file: {state_file}\n" in result.stdout
        with SqlStore.open(f"sqlite:///{db}") as store:
            assert store.switch().state.reason == "INC-1"
        assert read_state_file(state_file)["generation"] == 1  # type: ignore[index]
        assert not (tmp_path / "data").exists()

    def test_an_explicit_config_wins_over_the_default_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """CANARYD_CONFIG names another file: the default file is not read."""
        monkeypatch.setattr(
            config_module,
            "DEFAULT_CONFIG_PATH",
            _write_toml(tmp_path / "etc" / "canaryd.toml", "[nonsense]\n"),
        )
        other = _write_toml(tmp_path / "other.toml", "")
        _no_canaryd_env(monkeypatch, tmp_path / "data")
        monkeypatch.setenv("CANARYD_CONFIG", str(other))
        assert config_module.config_path(None) == other
        monkeypatch.setenv("CANARYD_CONFIG", "")
        assert config_module.config_path(None) is None  # empty: no file at all
        monkeypatch.delenv("CANARYD_CONFIG")
        assert config_module.config_path(None) == config_module.DEFAULT_CONFIG_PATH
        monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
        assert config_module.config_path(None) is None

    def test_a_config_without_storage_url_never_creates_a_database(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The runbook's command on a config that leaves storage.url to the environment
        (which the operator's shell lacks): no new empty database in the data directory,
        a warning that the built-in defaults are in use, and the state file names where
        the rollback went."""
        config = _write_toml(tmp_path / "etc" / "canaryd.toml", "[schedule]\n")
        _no_canaryd_env(monkeypatch, tmp_path / "data")
        result = CliRunner().invoke(
            app, ["switch", "rollback", "--config", str(config), "--reason", "INC-2"]
        )
        default_db = tmp_path / "data" / "canaryd.db"
        assert not default_db.exists()
        assert result.exit_code == 0, result.output
        assert "built-in default under" in result.output
        assert f"database: sqlite:///{default_db}" in result.output
        assert f"no database file at {str(default_db)!r}" in result.output
        assert "the database was NOT updated" in result.output
        assert f"state file: {tmp_path / 'data' / 'switch.json'}" in result.output

    def test_a_config_naming_the_default_paths_gets_no_default_warning(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The image's layout: the config names the database and state file under the data
        directory, the very paths the defaults would give. They are the service's (the
        config says so), so no warning that they might not be."""
        data = tmp_path / "data"
        _no_canaryd_env(monkeypatch, data)
        config = _write_toml(
            tmp_path / "etc" / "canaryd.toml",
            f'[storage]\nurl = "sqlite:///{data / "canaryd.db"}"\n'
            f'[switch]\nstate_file = "{data / "switch.json"}"\n',
        )
        result = CliRunner().invoke(
            app, ["switch", "rollback", "--config", str(config), "--reason", "INC-3"]
        )
        assert result.exit_code == 0, result.output
        assert f"database: sqlite:///{data / 'canaryd.db'}" in result.output
        assert "built-in default" not in result.output

    def test_the_database_and_state_file_are_printed_masked(self, cli: Cli) -> None:
        """Every path through the database prints the URL (password masked) and the file."""
        runner, url, env, state_file = cli
        for argv in (["rollback", "--reason", "a"], ["status"], ["auto"]):
            result = runner.invoke(app, ["switch", *argv, *url], env=env)
            assert result.exit_code == 0, result.output
            assert f"database: {mask_url(url[1])}\n" in result.stdout
            assert f"state file: {state_file}" in result.stdout
            assert ":canaryd@" not in result.output  # the test server's password


class TestHooksThatCannotBeBuilt:
    """A webhook secret the operator's shell lacks never stops the kill switch."""

    @pytest.fixture
    def webhook_config(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
        monkeypatch.delenv("CANARYD_TEST_UNSET_WEBHOOK_SECRET", raising=False)
        config = _write_toml(
            tmp_path / "hooks.toml",
            '[switch.webhook]\nurl = "http://127.0.0.1:1/hook"\n'
            'secret_env = "CANARYD_TEST_UNSET_WEBHOOK_SECRET"\nretries = 0\n',
        )
        return ["--config", str(config)]

    def test_rollback_without_the_hook_secret_succeeds(
        self, cli: Cli, webhook_config: list[str]
    ) -> None:
        """Database row and state file are written, exit 0; the webhook is reported and
        recorded as a failed actuation, which the daemon re-sends."""
        runner, url, env, state_file = cli
        result = runner.invoke(
            app, ["switch", "rollback", "--reason", "INC-3", *url, *webhook_config], env=env
        )
        assert result.exit_code == 0, result.output
        assert "switch rolled back: mode=rolled_back" in result.output
        assert (
            "webhook: not run from here: secret_env 'CANARYD_TEST_UNSET_WEBHOOK_SECRET' "
            "is not set" in result.output
        )
        assert read_state_file(state_file)["generation"] == 1  # type: ignore[index]
        with SqlStore.open(url[1]) as store:
            record = store.switch()
        assert record.state.reason == "INC-3" and not record.applied
        assert "is not set" in record.actuator_errors["webhook"]
        shown = runner.invoke(app, ["switch", "status", *url, *webhook_config], env=env)
        assert shown.exit_code == 0, shown.output
        assert "actuator webhook: FAILED: secret_env" in shown.output

    def test_emergency_rollback_without_the_hook_secret(
        self, down: Down, webhook_config: list[str]
    ) -> None:
        """With the database down as well, the state file is still written, exit 0."""
        runner, url, env, state_file = down
        result = runner.invoke(
            app, ["switch", "rollback", "--reason", "INC-4", *url, *webhook_config], env=env
        )
        assert result.exit_code == 0, result.output
        assert "IN THE STATE FILE ONLY" in result.output
        assert "webhook: secret_env 'CANARYD_TEST_UNSET_WEBHOOK_SECRET' is not set" in (
            result.output
        )
        assert read_state_file(state_file)["pending_sync"] is True  # type: ignore[index]


def _with_options(url: str, extra: str) -> str:
    """A PostgreSQL URL with `-c` settings added to its `options`."""
    parsed = make_url(url)
    options = f"{parsed.query.get('options', '')} {extra}".strip()
    return parsed.update_query_dict({"options": options}).render_as_string(hide_password=False)


def _assert_emergency(result: Result, state_file: Path, error: str) -> None:
    """Exit 0, no traceback, the warning that the database was not updated with the
    driver's error, and a pending manual rollback in the state file."""
    assert result.exit_code == 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "the database was NOT updated" in result.output
    assert error in result.output
    assert "IN THE STATE FILE ONLY" in result.output and "to be synced" in result.output
    data = read_state_file(state_file)
    assert data is not None and data["pending_sync"] is True
    assert data["mode"] == "rolled_back" and data["speculative_enabled"] is False


class TestEveryDatabaseFailureFallsBack:
    """Any failure of the database on `switch rollback` writes the emergency state file;
    `restore` and `auto` refuse in one line. Real faults, no mocks."""

    def _env(self, tmp_path: Path) -> tuple[dict[str, str], Path]:
        state_file = tmp_path / "state" / "switch.json"
        return {"CANARYD_SWITCH__STATE_FILE": str(state_file), "CANARYD_CONFIG": ""}, state_file

    def test_a_corrupt_sqlite_file(self, tmp_path: Path) -> None:
        """Garbage in the database file: exit 0 through the state file, the file is left
        as it was; restore, auto and status end in one line, exit 2, no traceback."""
        db = tmp_path / "canaryd.db"
        garbage = b"this is not an SQLite database\x00\xff" * 128
        db.write_bytes(garbage)
        env, state_file = self._env(tmp_path)
        url = ["--url", f"sqlite:///{db}"]
        runner = CliRunner()
        result = runner.invoke(app, ["switch", "rollback", "--reason", "INC-5", *url], env=env)
        _assert_emergency(result, state_file, "file is not a database")
        assert db.read_bytes() == garbage
        for argv in (["restore", "--force", "--reason", "x"], ["auto"], ["status"]):
            other = runner.invoke(app, ["switch", *argv, *url], env=env)
            assert other.exit_code == 2, other.output
            assert other.exception is None or isinstance(other.exception, SystemExit)
            assert "file is not a database" in other.output
            assert len(other.output.strip().splitlines()) == 1, other.output

    def test_a_missing_sqlite_file_is_not_created(self, tmp_path: Path) -> None:
        """A rollback never creates a fresh database: it says how to create it and writes
        the state file alone."""
        db = tmp_path / "absent" / "canaryd.db"
        env, state_file = self._env(tmp_path)
        result = CliRunner().invoke(
            app, ["switch", "rollback", "--reason", "INC-6", "--url", f"sqlite:///{db}"], env=env
        )
        _assert_emergency(result, state_file, f"no database file at {str(db)!r}")
        assert "canaryd db upgrade" in result.output
        assert not db.exists() and not db.parent.exists()

    def test_a_sqlite_database_locked_past_its_busy_timeout(self, tmp_path: Path) -> None:
        """Another writer holds the SQLite write lock longer than `?timeout=`."""
        db = tmp_path / "canaryd.db"
        env, state_file = self._env(tmp_path)
        runner = CliRunner()
        assert runner.invoke(app, ["db", "upgrade", "--url", f"sqlite:///{db}"]).exit_code == 0
        holder = sqlite3.connect(db, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            result = runner.invoke(
                app,
                ["switch", "rollback", "--reason", "INC-7", "--url", f"sqlite:///{db}?timeout=0.2"],
                env=env,
            )
        finally:
            holder.close()
        _assert_emergency(result, state_file, "database is locked")

    @pytest.mark.postgres
    @pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
    def test_a_read_only_postgresql_standby(self, database_url: str, tmp_path: Path) -> None:
        """After a failover the URL reaches a read-only server: the write fails, the
        state file is written; a forced restore refuses in one line."""
        env, state_file = self._env(tmp_path)
        runner = CliRunner()
        assert runner.invoke(app, ["db", "upgrade", "--url", database_url]).exit_code == 0
        url = ["--url", _with_options(database_url, "-c default_transaction_read_only=on")]
        result = runner.invoke(app, ["switch", "rollback", "--reason", "INC-8", *url], env=env)
        _assert_emergency(result, state_file, "read-only transaction")
        refused = runner.invoke(app, ["switch", "restore", "--force", "--reason", "x", *url])
        assert refused.exit_code == 2, refused.output
        assert "Traceback" not in refused.output
        last = refused.output.strip().splitlines()[-1]  # after the evidence it could read
        assert last.startswith("canaryd: error: switch restore refused") and "read-only" in last

    @pytest.mark.postgres
    @pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
    def test_permission_denied_on_postgresql(self, database_url: str, tmp_path: Path) -> None:
        """The role may read but not write the switch (its privileges revoked): the
        state file is written. (A chmod fault would not hold as root, which CI runs as.)"""
        env, state_file = self._env(tmp_path)
        runner = CliRunner()
        assert runner.invoke(app, ["db", "upgrade", "--url", database_url]).exit_code == 0
        engine = create_engine(database_url)
        try:
            with engine.begin() as connection:
                connection.execute(text("REVOKE INSERT, UPDATE ON switch_state FROM CURRENT_USER"))
        finally:
            engine.dispose()
        result = runner.invoke(
            app, ["switch", "rollback", "--reason", "INC-9", "--url", database_url], env=env
        )
        _assert_emergency(result, state_file, "permission denied")
