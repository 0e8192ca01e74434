"""The Alembic migrations: from empty to head, back, and matching the models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from canaryd.errors import DatabaseError
from canaryd.store import current_revision, head_revision, upgrade
from canaryd.store.database import make_engine
from canaryd.store.migrations import alembic_config
from canaryd.store.models import Base

REPO_ROOT = Path(__file__).resolve().parents[3]
TABLES = {
    "suites",
    "prompts",
    "runs",
    "pairs",
    "generations",
    "pair_scores",
    "pair_rollups",
    "switch_state",
    "switch_audit",
    "gate_decisions",
    "drift_references",
    "revisions",
    "telemetry_intervals",
    "tie_margins",
    "alembic_version",
}


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


class TestUpgrade:
    def test_upgrade_from_empty_creates_the_schema_at_head(self, database_url: str) -> None:
        """upgrade() on an empty database creates every table and records the head revision."""
        assert current_revision(database_url) is None
        assert upgrade(database_url) == head_revision()
        assert current_revision(database_url) == head_revision()
        assert table_names(database_url) == TABLES

    def test_upgrade_twice_is_a_no_op(self, database_url: str) -> None:
        """Upgrading a database already at head changes nothing."""
        upgrade(database_url)
        assert upgrade(database_url) == head_revision()

    def test_migrated_schema_matches_the_models(self, database_url: str) -> None:
        """Autogenerate finds no difference between the migrated schema and the models."""
        upgrade(database_url)
        engine = make_engine(database_url)
        try:
            with engine.connect() as connection:
                context = MigrationContext.configure(connection, opts={"compare_type": True})
                assert compare_metadata(context, Base.metadata) == []
        finally:
            engine.dispose()

    def test_downgrade_to_base_and_upgrade_again(self, database_url: str) -> None:
        """The initial migration is reversible: down to nothing, then up to head again."""
        upgrade(database_url)
        engine = make_engine(database_url)
        try:
            with engine.begin() as connection:
                config = alembic_config()
                config.attributes["connection"] = connection
                command.downgrade(config, "base")
        finally:
            engine.dispose()
        assert table_names(database_url) <= {"alembic_version"}
        assert current_revision(database_url) is None
        upgrade(database_url)
        assert current_revision(database_url) == head_revision()

    def test_upgrade_refuses_a_newer_database(self, database_url: str) -> None:
        """A database at a revision this canaryd does not know is never touched."""
        upgrade(database_url)
        engine = make_engine(database_url)
        try:
            with engine.begin() as connection:
                connection.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
        finally:
            engine.dispose()
        with pytest.raises(DatabaseError, match="newer than this canaryd"):
            upgrade(database_url)
        assert current_revision(database_url) == "ffff"


class TestCurrentRevision:
    def test_missing_sqlite_file_is_not_created(self, tmp_path: Path) -> None:
        """Asking for the revision of a SQLite file that does not exist does not create it."""
        path = tmp_path / "absent" / "canaryd.db"
        assert current_revision(f"sqlite:///{path}") is None
        assert not path.exists()


class TestAlembicCommandLine:
    def test_plain_alembic_upgrades_with_an_x_url(self, database_url: str) -> None:
        """`alembic -c alembic.ini -x url=… upgrade head` works from the repository root."""
        env = {k: v for k, v in os.environ.items() if k != "CANARYD_DATABASE_URL"}
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "alembic",
                "-c",
                "alembic.ini",
                "-x",
                f"url={database_url}",
                "upgrade",
                "head",
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr
        assert current_revision(database_url) == head_revision()

    def test_plain_alembic_reads_the_url_from_the_environment(self, database_url: str) -> None:
        """Without -x url, the Alembic CLI uses CANARYD_DATABASE_URL."""
        env = {**os.environ, "CANARYD_DATABASE_URL": database_url}
        completed = subprocess.run(
            [sys.executable, "-m", "alembic", "-c", "alembic.ini", "upgrade", "head"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr
        assert current_revision(database_url) == head_revision()
