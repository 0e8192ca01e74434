"""`canaryd db upgrade|current`, through the CLI runner: exit codes and what a person reads.

(Lives beside the store tests because the store owns this command; it mirrors
canaryd/cli/db.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.store import current_revision, head_revision

runner = CliRunner()


def error_line(stderr: str) -> str:
    """The single line an error must be, with no traceback."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("canaryd: error: ")
    return lines[0]


class TestDbUpgrade:
    def test_upgrade_then_current(self, database_url: str) -> None:
        """upgrade creates the schema and says so; current then reports the head revision."""
        upgraded = runner.invoke(app, ["db", "upgrade", "--url", database_url])
        assert upgraded.exit_code == 0, upgraded.output
        assert f"schema upgraded from empty to revision {head_revision()} (head)" in upgraded.stdout
        current = runner.invoke(app, ["db", "current", "--url", database_url])
        assert current.exit_code == 0, current.output
        assert f"schema at revision {head_revision()} (head)" in current.stdout

    def test_upgrade_again_says_already_current(self, database_url: str) -> None:
        """A second upgrade reports that there was nothing to do."""
        runner.invoke(app, ["db", "upgrade", "--url", database_url])
        again = runner.invoke(app, ["db", "upgrade", "--url", database_url])
        assert again.exit_code == 0
        assert "already at revision" in again.stdout

    def test_url_comes_from_the_environment(
        self, database_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without --url, CANARYD_DATABASE_URL names the database."""
        monkeypatch.setenv("CANARYD_DATABASE_URL", database_url)
        assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
        assert current_revision(database_url) == head_revision()

    def test_default_is_the_sqlite_file_in_the_data_dir(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without --url or the variable, the default SQLite file is created in the data dir."""
        monkeypatch.delenv("CANARYD_DATABASE_URL", raising=False)
        monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
        result = runner.invoke(app, ["db", "upgrade"])
        assert result.exit_code == 0, result.output
        assert (tmp_path / "data" / "canaryd.db").exists()


class TestDbCurrent:
    def test_unmigrated_database_says_what_to_run(self, database_url: str) -> None:
        """current on an empty database exits 2 with the upgrade command to run."""
        result = runner.invoke(app, ["db", "current", "--url", database_url])
        assert result.exit_code == 2
        assert "has no canaryd schema; create it with `canaryd db upgrade --url " in error_line(
            result.stderr
        )


class TestBadUrls:
    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("not a url", "cannot parse database URL 'not a url'"),
            ("mysql://me:hunter2@db.example/canary", "unsupported database driver 'mysql'"),
            ("postgresql+asyncpg://me:hunter2@db/c", "unsupported database driver"),
            ("sqlite://", "in-memory SQLite database"),
        ],
    )
    def test_bad_url_is_one_line_with_the_expected_forms(self, url: str, expected: str) -> None:
        """A bad URL exits non-zero with one line naming it (password masked) and the forms."""
        result = runner.invoke(app, ["db", "current", "--url", url])
        assert result.exit_code == 2
        line = error_line(result.stderr)
        assert expected in line
        assert "sqlite:///path or postgresql+psycopg://user:pass@host/db" in line
        assert "hunter2" not in line

    def test_unreachable_server_names_host_and_what_to_check(self) -> None:
        """A server that refuses connections is one line naming host, port and what to check."""
        url = "postgresql+psycopg://me:hunter2@127.0.0.1:1/canary"
        result = runner.invoke(app, ["db", "upgrade", "--url", url])
        assert result.exit_code == 2
        line = error_line(result.stderr)
        assert "cannot connect to PostgreSQL at 127.0.0.1:1" in line
        assert "check that the server is running" in line
        assert "hunter2" not in line


class TestDbRepin:
    def test_repin_forgets_the_named_category_then_the_rest(self, database_url: str) -> None:
        """`db repin --category code` forgets code's pins only; `db repin` the rest."""
        from datetime import UTC, datetime

        from canaryd.store import SqlStore
        from gates import ReferenceStats

        pin = ReferenceStats(2.0, 0.6, 30, 0.6, 0.3)
        with SqlStore.open(database_url, create=True) as store:
            store.pin_drift_references({"code": pin, "qa": pin}, datetime.now(UTC), "arms")
        one = runner.invoke(app, ["db", "repin", "--category", "code", "--url", database_url])
        assert one.exit_code == 0, one.output
        assert "1 drift pin(s) forgotten (code)" in one.stdout
        every = runner.invoke(app, ["db", "repin", "--url", database_url])
        assert every.exit_code == 0, every.output
        assert "1 drift pin(s) forgotten (every category)" in every.stdout
        with SqlStore.open(database_url) as store:
            assert store.drift_references("arms") == {}

    def test_repin_on_an_empty_database_is_one_clear_line(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 'none.db'}"
        result = runner.invoke(app, ["db", "repin", "--url", url])
        assert result.exit_code == 2
        assert "canaryd db upgrade" in error_line(result.stderr)
