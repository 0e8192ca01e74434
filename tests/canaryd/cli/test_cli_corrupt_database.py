"""The error contract on every command: a corrupt SQLite file is one line that names the
file and what to do, exit 2 — never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app

COMMANDS = [
    ["status"],
    ["gates"],
    ["audit"],
    ["db", "current"],
    ["db", "upgrade"],
    ["once", "--pairs", "1"],
    ["run"],
    ["report"],
    ["switch", "status"],
]


@pytest.fixture
def corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    database = tmp_path / "canaryd.db"
    database.write_bytes(b"this is not a database, it is a text file " * 200)
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CANARYD_DATABASE_URL", f"sqlite:///{database}")
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    config = tmp_path / "canaryd.toml"
    config.write_text(
        '[arms.baseline]\nkind = "fake"\n[arms.speculative]\nkind = "fake"\n'
        'speculative = true\n[server]\nlisten = "127.0.0.1:0"\n'
    )
    monkeypatch.setenv("CANARYD_CONFIG", str(config))
    return database


class TestCorruptSqliteFile:
    @pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
    def test_every_command_says_one_line_and_exits_2(
        self, corrupt: Path, command: list[str]
    ) -> None:
        """One line on stderr naming the file, the driver's reason and the way out."""
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        lines = [line for line in result.stderr.splitlines() if line.startswith("canaryd: error:")]
        assert len(lines) == 1, result.stderr
        assert str(corrupt) in lines[0] and "file is not a database" in lines[0]
        assert "move it away" in lines[0]
