"""`canaryd once` end to end on the fake engine: pairs run, stored, summarised; bad input
gets one clear line and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.store import SqlStore

FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    return tmp_path


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(FAKE_ARMS + extra)
    return path


class TestOnceJson:
    def test_runs_stores_and_prints_the_documented_shape(self, env: Path) -> None:
        """--json prints run_id, a summary per category and every pair; the pairs are stored."""
        result = CliRunner().invoke(
            app, ["once", "--config", str(config(env)), "--pairs", "10", "--json"]
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert set(data) >= {"run_id", "summary", "pairs"}
        assert len(data["pairs"]) == 10
        assert "all" in data["summary"]
        pair = data["pairs"][0]
        assert set(pair) >= {"prompt_id", "category", "baseline", "speculative", "scores"}
        for arm in ("baseline", "speculative"):
            assert set(pair[arm]) >= {"ttft_s", "tpot_s", "e2e_s", "output_tokens", "error"}
        assert set(pair["speculative"]) >= {
            "verify_steps",
            "draft_tokens",
            "accepted_tokens",
            "accepted_per_position",
        }
        assert "exact_match" in pair["scores"]
        categories = {p["category"] for p in data["pairs"]}
        assert len(categories) >= 8, "10 stratified pairs cover at least 8 categories"
        store = SqlStore.open(f"sqlite:///{env / 'data' / 'canaryd.db'}")
        try:
            stored = store.pairs(run_id=data["run_id"])
        finally:
            store.close()
        assert sorted(r.pair_id for r in stored) == sorted(p["pair_id"] for p in data["pairs"])

    def test_category_filter(self, env: Path) -> None:
        """--category runs only that category's prompts."""
        result = CliRunner().invoke(
            app, ["once", "-c", str(config(env)), "-n", "3", "--category", "math", "--json"]
        )
        assert result.exit_code == 0, result.output
        assert {p["category"] for p in json.loads(result.stdout)["pairs"]} == {"math"}

    def test_table_lists_categories_and_all(self, env: Path) -> None:
        """Without --json a table shows each category and the `all` row."""
        result = CliRunner().invoke(
            app, ["once", "-c", str(config(env)), "-n", "4", "--category", "code"]
        )
        assert result.exit_code == 0, result.output
        assert "code" in result.stdout and "all" in result.stdout
        assert "speedup" in result.stdout


class TestOnceBadInput:
    def test_unknown_category(self, env: Path) -> None:
        """An unknown category is one line naming it and the known ones; exit 2."""
        result = CliRunner().invoke(app, ["once", "-c", str(config(env)), "--category", "poetry"])
        assert result.exit_code == 2
        assert "unknown category 'poetry'; known categories:" in result.stderr
        assert "Traceback" not in result.output

    def test_bad_prompt_file(self, env: Path) -> None:
        """A broken suite file is reported as file:line: reason."""
        bad = env / "bad.jsonl"
        bad.write_text('{"id": "x", "category": "qa"\n')
        path = config(env, f'[prompts]\nsuites = ["{bad}"]\n')
        result = CliRunner().invoke(app, ["once", "-c", str(path)])
        assert result.exit_code != 0
        assert f"{bad}:1:" in result.stderr
        assert "Traceback" not in result.output

    def test_bad_database_url(self, env: Path) -> None:
        """An unusable database URL is one line naming it; nothing runs."""
        path = config(env, '[storage]\nurl = "nosuchdb://x/y"\n')
        result = CliRunner().invoke(app, ["once", "-c", str(path)])
        assert result.exit_code != 0
        assert "nosuchdb" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1

    def test_bad_config_value(self, env: Path) -> None:
        """A bad config value names the file and key."""
        path = config(env, "[prompts]\nmax_tokens = 0\n")
        result = CliRunner().invoke(app, ["once", "-c", str(path)])
        assert result.exit_code == 2
        assert f"{path}: prompts.max_tokens:" in result.stderr

    def test_no_model_pulled(self, env: Path) -> None:
        """The default (embedded) arms with no pulled model say to run `canaryd models pull`."""
        result = CliRunner().invoke(app, ["once", "-n", "1"])
        assert result.exit_code != 0
        assert "canaryd models pull" in result.stderr
        assert "Traceback" not in result.output
