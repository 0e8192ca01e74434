"""The `canaryd` entry point: `--version`, a summary per command that matches the command's
own help, help without `<bool>` noise, sub-commands imported only when they run (the kill
switch imports no statistics, engines or plotting), and the commands that use no secret
running without the service's EnvironmentFile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd import __version__
from canaryd.cli.app import COMMANDS, app, load_command

REPO_ROOT = Path(__file__).resolve().parents[3]
# What a kill switch must not wait for: statistics, engines, scoring and plotting.
HEAVY = ("scipy", "numpy", "torch", "transformers", "evaluate", "datasets", "matplotlib")


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").split("\n\n")[0].split())


def _run_and_list_modules(args: list[str], env: dict[str, str]) -> tuple[int, list[str], str]:
    """Run `canaryd ARGS` in a fresh interpreter; its exit code, the heavy modules it
    imported, and its output."""
    code = (
        "import json, sys\n"
        "from canaryd.cli.app import app\n"
        "try:\n"
        f"    app({args!r})\n"
        "    rc = 0\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code or 0\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return int(result["rc"]), list(result["heavy"]), done.stdout + done.stderr


class TestEntryPoint:
    def test_version(self) -> None:
        """`canaryd --version` prints the package's version and exits 0."""
        result = CliRunner().invoke(app, ["--version"])
        assert result.exit_code == 0
        assert result.stdout.strip() == f"canaryd {__version__}"

    def test_version_is_the_projects(self) -> None:
        """`canaryd.__version__` is pyproject.toml's version (the wheel's)."""
        project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        assert project["project"]["version"] == __version__

    @pytest.mark.parametrize("name", sorted(COMMANDS))
    def test_summary_is_the_commands_own_help(self, name: str) -> None:
        """The top-level help's line for a command is the first paragraph of its help."""
        command = load_command(name)
        assert COMMANDS[name].summary == _first_paragraph(command.help), name

    def test_help_lists_every_command_without_type_noise(self) -> None:
        """`canaryd --help` names every command; flags show no `<bool>` type."""
        result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0
        for name in COMMANDS:
            assert f" {name} " in result.stdout, name
        assert "<bool>" not in result.stdout
        assert "--version" in result.stdout

    def test_sub_command_help_has_no_bool_noise_nor_lost_markup(self) -> None:
        """`switch status --help` shows flags bare; nginx-map's help keeps `[switch.command]`
        (not eaten as a markup tag); no group offers shell-completion options."""
        runner = CliRunner()
        status = runner.invoke(app, ["switch", "status", "--help"], env={"COLUMNS": "200"})
        assert status.exit_code == 0
        assert "<bool>" not in status.stdout and "--json" in status.stdout
        group = runner.invoke(app, ["switch", "--help"], env={"COLUMNS": "200"})
        assert "[switch.command]" in group.stdout
        assert "as a `` hook" not in group.stdout
        assert "--install-completion" not in group.stdout

    def test_unknown_command_fails(self) -> None:
        """A command that does not exist is a usage error (exit 2) in one line, not a crash."""
        result = CliRunner().invoke(app, ["no-such-command"])
        assert result.exit_code == 2
        assert result.stderr == (
            "canaryd: error: no such command 'no-such-command' (see canaryd --help)\n"
        )


class TestUsageErrors:
    @pytest.mark.parametrize(
        ("args", "line"),
        [
            (["once", "--bogus"], "no such option --bogus (see canaryd once --help)"),
            (
                ["once", "--pair", "3"],
                "no such option --pair (did you mean --pairs?) (see canaryd once --help)",
            ),
            (["once", "--category"], "option '--category' requires an argument"),
            (["once", "--pairs", "x"], "invalid value for --pairs: "),
            (
                ["switch", "rollback"],
                "missing option --reason (see canaryd switch rollback --help)",
            ),
            (["switch", "bogus"], "no such command 'bogus' (see canaryd switch --help)"),
            (["--bogus"], "no such option --bogus (see canaryd --help)"),
        ],
    )
    def test_one_line_naming_the_flag(self, args: list[str], line: str) -> None:
        """An unknown option, a missing value or argument and a bad value each print one
        `canaryd: error: …` line naming the flag and the help to read, and exit 2 — no box."""
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"canaryd: error: {line}"), result.stderr
        assert "--help)" in result.stderr
        assert "╭" not in result.stderr and "Usage:" not in result.stderr

    def test_a_bare_group_still_shows_its_help(self) -> None:
        """`canaryd switch` alone is not an error line: it prints the group's help."""
        result = CliRunner().invoke(app, ["switch"], env={"COLUMNS": "200"})
        assert "rollback" in result.output and "canaryd: error" not in result.output

    def test_as_a_user_runs_it(self) -> None:
        """`python -m canaryd once --bogus` in a fresh interpreter: one line on stderr
        naming `canaryd once`, nothing on stdout, exit 2."""
        done = subprocess.run(
            [sys.executable, "-m", "canaryd", "once", "--bogus"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr == "canaryd: error: no such option --bogus (see canaryd once --help)\n"


@pytest.fixture
def service_config(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A migrated SQLite database and a config like the service's: `[traffic] listen` set,
    its hash key only in the service's environment (absent here)."""
    database = f"sqlite:///{tmp_path / 'canaryd.db'}"
    config = tmp_path / "canaryd.toml"
    config.write_text(
        f'[storage]\nurl = "{database}"\n'
        f'[switch]\nstate_file = "{tmp_path / "switch.json"}"\n'
        '[traffic]\nlisten = "127.0.0.1:0"\n',
        encoding="utf-8",
    )
    env = {
        name: value for name, value in os.environ.items() if not name.upper().startswith("CANARYD_")
    }
    env["CANARYD_DATA_DIR"] = str(tmp_path / "data")
    upgraded = CliRunner().invoke(app, ["db", "upgrade", "--config", str(config)], env=env)
    assert upgraded.exit_code == 0, upgraded.output
    return config, env


class TestKillSwitchScope:
    def test_switch_runs_without_the_services_secrets(
        self, service_config: tuple[Path, dict[str, str]]
    ) -> None:
        """With `traffic.listen` set and no CANARYD_TRAFFIC__HASH_KEY, `switch rollback`,
        `switch status` and `gates` run (they use no secret), while `run`'s reading of the
        same file still refuses it."""
        config, env = service_config
        runner = CliRunner()
        rollback = runner.invoke(
            app, ["switch", "rollback", "--reason", "incident", "--config", str(config)], env=env
        )
        assert rollback.exit_code == 0, rollback.output
        assert "switch rolled back: mode=rolled_back" in rollback.stdout
        status = runner.invoke(app, ["switch", "status", "--config", str(config)], env=env)
        assert status.exit_code == 0, status.output
        assert "mode: rolled_back" in status.stdout
        gates = runner.invoke(app, ["gates", "--config", str(config)], env=env)
        assert gates.exit_code == 0, gates.output

        from canaryd.config import load_settings
        from canaryd.errors import ConfigError

        with pytest.raises(ConfigError, match=r"traffic\.hash_key"):
            load_settings(config)

    def test_status_of_a_switch_never_moved(
        self, service_config: tuple[Path, dict[str, str]]
    ) -> None:
        """A switch that never moved says so instead of `since: - by -`."""
        config, env = service_config
        status = CliRunner().invoke(app, ["switch", "status", "--config", str(config)], env=env)
        assert status.exit_code == 0, status.output
        assert "since: never moved (the initial state)" in status.stdout
        assert "- by -" not in status.stdout

    def test_switch_imports_nothing_heavy(
        self, service_config: tuple[Path, dict[str, str]]
    ) -> None:
        """`switch status` and `switch rollback`, run in a fresh interpreter, import no
        statistics, engine, scoring or plotting library; nor do `--help` and `--version`."""
        config, env = service_config
        for args in (
            ["switch", "status", "--config", str(config)],
            ["switch", "rollback", "--reason", "incident", "--config", str(config)],
            ["--help"],
            ["--version"],
        ):
            rc, heavy, output = _run_and_list_modules(args, env)
            assert rc == 0, output
            assert heavy == [], (args, heavy)
