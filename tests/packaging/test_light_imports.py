"""What the kill switch imports: `canaryd switch status`, `rollback` and `restore`, run as
an operator runs them (a fresh interpreter, the service's config with `[traffic] listen`
set and no hash key, a migrated SQLite database), import none of the heavy modules —
statistics (scipy, numpy), engines (torch, transformers), plotting (matplotlib), Alembic
(the schema check reads the revision itself) and httpx (no webhook is configured) — and
`canaryd --help` and `--version` import no database either. Nor do the switch commands
import what they do not use (`SWITCH_UNUSED`): the whole `Settings` and its other sections
(the engines' configuration), every gate's configuration (`gates.config`: the switch
policy's is its own), pydantic-settings (no `CANARYD_<SECTION>` variable is set
in the operator's shell), the history's ORM models, SQLAlchemy's ORM (the switch's
tables are queried in Core) and, on SQLite, PostgreSQL's dialect; and `switch status`, which logs
nothing, imports no logging library (`LOGGING`: structlog is configured, with rich, only
when something logs, as a transition or a refusal does). A correctness test of the
imports, not a timing test; benchmarks/cli_startup.py times them. The revisions the schema
check reads from the migration files' names are Alembic's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from canaryd.store.migrations import alembic_config, head_revision, known_revisions

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("scipy", "numpy", "torch", "transformers", "matplotlib", "alembic", "httpx")
SWITCH_UNUSED = (
    "canaryd.config.settings",
    "canaryd.config.sections",
    "engine.config",
    "gates.config",
    "canaryd.store.models",
    "pydantic_settings",  # no CANARYD_<SECTION> variable set: the file alone is read
    # The switch's tables are queried in SQLAlchemy Core, their JSON columns compiled for
    # SQLite: neither the ORM nor PostgreSQL's dialect is needed on SQLite.
    "sqlalchemy.orm",
    "sqlalchemy.dialects.postgresql",
)
LOGGING = ("structlog", "rich")
# Runs canaryd's entry point with the arguments given, then prints which of the modules
# named in LIGHT_MODULES it imported (on stderr, whatever the exit code).
PROBE = (
    "import atexit, os, sys\n"
    "watched = os.environ['LIGHT_MODULES'].split(',')\n"
    "atexit.register(lambda: print('imported:' + ','.join(m for m in watched "
    "if m in sys.modules), file=sys.stderr))\n"
    "sys.argv = ['canaryd', *sys.argv[1:]]\n"
    "from canaryd.cli.app import main\n"
    "main()\n"
)


def run(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `canaryd ARGS` in a fresh interpreter; its result and the watched modules it
    imported."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=REPO_ROOT,
        env={**env, "LIGHT_MODULES": ",".join((*HEAVY, *SWITCH_UNUSED, *LOGGING, "sqlalchemy"))},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    line = next((x for x in done.stderr.splitlines() if x.startswith("imported:")), None)
    assert line is not None, done.stdout + done.stderr
    return done, set(filter(None, line.removeprefix("imported:").split(",")))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """A shell without the service's environment, the service's config and its migrated
    database."""
    root = tmp_path_factory.mktemp("switch")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CANARYD_")}
    env.update(PYTHONPATH=str(REPO_ROOT), CANARYD_DATA_DIR=str(root / "data"), COLUMNS="200")
    config = root / "canaryd.toml"
    config.write_text(
        f'[storage]\nurl = "sqlite:///{root / "canaryd.db"}"\n'
        f'[switch]\nstate_file = "{root / "switch.json"}"\n'
        '[traffic]\nlisten = "127.0.0.1:0"\n',
        encoding="utf-8",
    )
    upgraded = subprocess.run(
        [sys.executable, "-m", "canaryd", "db", "upgrade", "--config", str(config)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stderr
    return env, config


class TestSwitchImports:
    @pytest.mark.parametrize(
        ("args", "code", "says"),
        [
            (("switch", "status"), 0, "mode: auto (speculative decoding ENABLED)"),
            (("switch", "rollback", "--reason", "test"), 0, "rolled back"),
            # No gate evidence in a new database: refused, after the same imports.
            (("switch", "restore", "--reason", "test"), 1, "restore"),
        ],
        ids=["status", "rollback", "restore"],
    )
    def test_switch_command_imports_nothing_heavy(
        self, service: tuple[dict[str, str], Path], args: tuple[str, ...], code: int, says: str
    ) -> None:
        """Each switch command does its job and imports none of the heavy modules, nor
        any it does not use."""
        env, config = service
        done, imported = run(env, *args, "--config", str(config))
        assert done.returncode == code, done.stdout + done.stderr
        assert says in done.stdout + done.stderr
        assert "sqlalchemy" in imported  # the probe sees what the command imported
        assert imported & set(HEAVY) == set()
        assert imported & set(SWITCH_UNUSED) == set()
        if args[1] == "status":
            assert imported & set(LOGGING) == set()

    @pytest.mark.parametrize("args", [("--help",), ("--version",)], ids=["help", "version"])
    def test_help_and_version_import_no_database(
        self, service: tuple[dict[str, str], Path], args: tuple[str, ...]
    ) -> None:
        """`canaryd --help` and `--version` answer without the database or anything heavy
        (typer renders the help with rich)."""
        env, _ = service
        done, imported = run(env, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip()
        assert imported - {"rich"} == set()


class TestRevisionsFromFileNames:
    def test_alembic_agrees(self) -> None:
        """The revisions and the head read from the migration files' names are the ones
        Alembic reads from the files, in one line with no branch."""
        from alembic.script import ScriptDirectory

        script = ScriptDirectory.from_config(alembic_config())
        assert known_revisions() == {s.revision for s in script.walk_revisions()}
        assert script.get_heads() == [head_revision()]
