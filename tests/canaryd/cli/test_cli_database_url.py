"""One database URL rule for every command, through the CLI runner on real SQLite files:
`--url`, else `storage.url` (a `--config` file or CANARYD_STORAGE__URL), else
CANARYD_DATABASE_URL, else the default file in the data directory — which a command
given any of the others never creates."""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.store import SqlStore, current_revision, head_revision
from canaryd.switch import read_state_file

runner = CliRunner()

FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""


@dataclass(frozen=True)
class Setup:
    """A database the URL rule must find, the arguments (if any) that name it, and the
    default file that must stay absent."""

    url: str
    args: list[str]
    default_db: Path
    state_file: Path
    tmp: Path

    def invoke(self, *argv: str) -> tuple[int, str, str]:
        result = runner.invoke(app, [*argv, *self.args])
        return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No URL or config from the environment; the data directory (and with it the default
    database) under tmp_path; the state file in a directory of its own."""
    for name in ("CANARYD_DATABASE_URL", "CANARYD_STORAGE__URL", "CANARYD_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CANARYD_SWITCH__STATE_FILE", str(tmp_path / "state" / "switch.json"))
    yield tmp_path / "data" / "canaryd.db"


@pytest.fixture(params=["CANARYD_STORAGE__URL", "--config"])
def setup(
    request: pytest.FixtureRequest,
    clean_env: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Setup:
    """The database named ONLY by CANARYD_STORAGE__URL, or ONLY by a `--config` file."""
    url = f"sqlite:///{tmp_path / 'named' / 'canaryd.db'}"
    (tmp_path / "named").mkdir()
    args: list[str] = []
    if request.param == "CANARYD_STORAGE__URL":
        monkeypatch.setenv("CANARYD_STORAGE__URL", url)
    else:
        config = tmp_path / "canaryd.toml"
        config.write_text(f'[storage]\nurl = "{url}"\n', encoding="utf-8")
        args = ["--config", str(config)]
    return Setup(url, args, clean_env, tmp_path / "state" / "switch.json", tmp_path)


class TestStorageUrlOnly:
    def test_db_upgrade_and_current(self, setup: Setup) -> None:
        """`db upgrade` migrates the configured database, `db current` reads it, and
        neither touches the default file."""
        code, out, err = setup.invoke("db", "upgrade")
        assert code == 0, err
        assert out.strip() == (
            f"{setup.url}: schema upgraded from empty to revision {head_revision()} (head)"
        )
        assert current_revision(setup.url) == head_revision()
        code, out, err = setup.invoke("db", "current")
        assert code == 0, err
        assert out.strip() == f"{setup.url}: schema at revision {head_revision()} (head)"
        assert not setup.default_db.exists()

    def test_switch_rollback_then_status(self, setup: Setup) -> None:
        """`switch rollback` records the kill switch in the configured database and
        `switch status` reads it back from there."""
        assert setup.invoke("db", "upgrade")[0] == 0
        code, out, err = setup.invoke("switch", "rollback", "--reason", "INC-7")
        assert code == 0, err
        assert "switch rolled back: mode=rolled_back speculative_enabled=false" in out
        assert f"state file: {setup.state_file}" in out
        with SqlStore.open(setup.url) as store:
            state = store.switch().state
        assert state.generation == 1 and state.reason == "INC-7"
        code, out, err = setup.invoke("switch", "status")
        assert code == 0, err
        assert "mode: rolled_back (speculative decoding DISABLED)" in out
        assert "reason: INC-7" in out
        assert f"state file: {setup.state_file} (in sync)" in out
        assert not setup.default_db.exists()

    def test_switch_status_of_a_missing_database_names_it(self, setup: Setup) -> None:
        """`switch status` does not create a database: a missing configured file is exit 2
        with the command to run, and the default file is not created either."""
        code, _, err = setup.invoke("switch", "status")
        assert code == 2
        assert err.startswith("canaryd: error: ") and "canaryd db upgrade" in err
        assert not Path(setup.url.removeprefix("sqlite:///")).exists()
        assert not setup.default_db.exists()

    def test_audit(self, setup: Setup) -> None:
        """`audit` lists the rollback recorded in the configured database."""
        assert setup.invoke("db", "upgrade")[0] == 0
        assert setup.invoke("switch", "rollback", "--reason", "INC-8")[0] == 0
        code, out, err = setup.invoke("audit", "--since", "1h")
        assert code == 0, err
        assert "gen 1 auto -> rolled_back (manual)" in out
        assert f"by user:{getpass.getuser()}: INC-8" in out
        code, out, err = setup.invoke("audit", "--since", "1h", "--json")
        assert code == 0, err
        assert [(e["generation"], e["reason"]) for e in json.loads(out)] == [(1, "INC-8")]
        assert not setup.default_db.exists()

    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (["status"], "no pairs recorded yet"),
            (["gates"], "no gate decisions recorded yet"),
            (["report", "--since", "1h"], "wrote "),
        ],
    )
    def test_read_commands(self, setup: Setup, argv: list[str], expected: str) -> None:
        """`status`, `gates` and `report` read the configured database."""
        assert setup.invoke("db", "upgrade")[0] == 0
        if argv[0] == "report":
            argv = [*argv, "--out", str(setup.tmp / "report.html")]
        code, out, err = setup.invoke(*argv)
        assert code == 0, err
        assert expected in out
        assert not setup.default_db.exists()


class TestPrecedence:
    def test_database_url_env_is_used_by_every_command(
        self, clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """CANARYD_DATABASE_URL alone names the database of `once` and `db upgrade` alike."""
        url = f"sqlite:///{tmp_path / 'env.db'}"
        monkeypatch.setenv("CANARYD_DATABASE_URL", url)
        config = tmp_path / "fake.toml"
        config.write_text(FAKE_ARMS, encoding="utf-8")
        result = runner.invoke(app, ["once", "--config", str(config), "-n", "2", "--json"])
        assert result.exit_code == 0, result.output
        run_id = json.loads(result.stdout)["run_id"]
        with SqlStore.open(url) as store:
            assert len(store.pairs(run_id=run_id)) == 2
        upgraded = runner.invoke(app, ["db", "upgrade"])
        assert upgraded.exit_code == 0, upgraded.output
        assert upgraded.stdout.strip() == (
            f"{url}: schema already at revision {head_revision()} (head)"
        )
        assert not clean_env.exists()

    def test_url_beats_storage_url_beats_database_url_env(
        self, clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`--url` wins over the config's storage.url, which wins over CANARYD_DATABASE_URL."""
        urls = {name: f"sqlite:///{tmp_path / name}.db" for name in ("flag", "config", "env")}
        monkeypatch.setenv("CANARYD_DATABASE_URL", urls["env"])
        config = tmp_path / "canaryd.toml"
        config.write_text(f'[storage]\nurl = "{urls["config"]}"\n', encoding="utf-8")
        by_config = runner.invoke(app, ["db", "upgrade", "-c", str(config)])
        assert by_config.exit_code == 0, by_config.output
        assert by_config.stdout.startswith(f"{urls['config']}: schema upgraded")
        by_flag = runner.invoke(app, ["db", "upgrade", "-c", str(config), "--url", urls["flag"]])
        assert by_flag.exit_code == 0, by_flag.output
        assert by_flag.stdout.startswith(f"{urls['flag']}: schema upgraded")
        by_env = runner.invoke(app, ["db", "upgrade"])
        assert by_env.exit_code == 0, by_env.output
        assert by_env.stdout.startswith(f"{urls['env']}: schema upgraded")
        assert not clean_env.exists()

    def test_config_comes_from_canaryd_config(
        self, clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without `--config`, CANARYD_CONFIG names the file whose storage.url is used."""
        url = f"sqlite:///{tmp_path / 'from-env-config.db'}"
        config = tmp_path / "canaryd.toml"
        config.write_text(f'[storage]\nurl = "{url}"\n', encoding="utf-8")
        monkeypatch.setenv("CANARYD_CONFIG", str(config))
        assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
        assert current_revision(url) == head_revision()
        result = runner.invoke(app, ["switch", "rollback", "--reason", "x"])
        assert result.exit_code == 0, result.output
        with SqlStore.open(url) as store:
            assert store.switch().state.reason == "x"
        assert read_state_file(tmp_path / "state" / "switch.json") is not None
        assert not clean_env.exists()


class TestSince:
    @pytest.mark.parametrize("argv", [["audit"], ["report"]])
    def test_bad_since_is_one_line_with_the_forms(
        self, clean_env: Path, tmp_path: Path, argv: list[str]
    ) -> None:
        """`audit` and `report` refuse the same bad --since with the same line, exit 2."""
        url = f"sqlite:///{tmp_path / 'x.db'}"
        result = runner.invoke(app, [*argv, "--since", "yesterday", "--url", url])
        assert result.exit_code == 2
        assert result.stderr == (
            "canaryd: error: --since 'yesterday': expected a duration (90s, 30m, 24h, 7d, 2w) "
            "or an ISO time (2025-12-01T08:00:00+00:00; no zone means UTC)\n"
        )

    def test_report_accepts_an_iso_time(self, clean_env: Path, tmp_path: Path) -> None:
        """`report --since` takes an ISO time like `audit --since` does."""
        url = f"sqlite:///{tmp_path / 'r.db'}"
        assert runner.invoke(app, ["db", "upgrade", "--url", url]).exit_code == 0
        out = tmp_path / "report.html"
        result = runner.invoke(
            app, ["report", "--since", "2025-12-01T08:00:00", "--url", url, "--out", str(out)]
        )
        assert result.exit_code == 0, result.output
        assert out.exists()
