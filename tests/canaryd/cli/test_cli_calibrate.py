"""`canaryd calibrate` end to end on fake engines and a real SQLite file: prompts run greedy
three times each, the JSON and the table say what was seen; with no measured divergence
(healthy arms, or arms no teacher can judge) nothing is stored and the command exits 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import load_settings
from canaryd.config.arms import arm_key
from canaryd.store import SqlStore


def arms(corrupt_rate: float) -> str:
    return f"""
[arms.baseline]
kind = "fake"
seed = 1
[arms.speculative]
kind = "fake"
speculative = true
seed = 1
corrupt_rate = {corrupt_rate}
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    return tmp_path


def config(tmp_path: Path, corrupt_rate: float = 0.0) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(arms(corrupt_rate))
    return path


class TestCalibrate:
    def test_json_names_what_was_seen_and_stores_nothing_without_a_bound(self, env: Path) -> None:
        """Every speculative output corrupted: 6 A/B divergences, none measurable (the
        fake engine scores nothing and lists no log-probs), so no bound: exit 3."""
        path = config(env, corrupt_rate=1.0)
        result = CliRunner().invoke(
            app, ["calibrate", "--config", str(path), "--prompts", "6", "--json"]
        )
        assert result.exit_code == 3, result.output
        data = json.loads(result.stdout)
        assert data["aa_arm"] == "baseline"
        assert data["prompts"] == 6 and data["pairs"] == 12 and data["failures"] == 0
        assert data["divergences"] == {"aa": 0, "ab": 0, "unmeasured": 6, "needed": 119}
        assert data["bound"] is None and data["stored"] is False
        assert data["configured_margin"] == 0.5
        assert (data["coverage"], data["confidence"]) == (0.975, 0.95)
        assert "order statistic" in data["method"]
        settings = load_settings(path)
        assert data["arms"] == arm_key(settings, "speculative")
        with SqlStore.open(settings.storage.resolved_url()) as store:
            assert store.tie_margin(data["arms"]) is None

    def test_the_table_says_why_nothing_was_stored(self, env: Path) -> None:
        """Healthy fake arms agree on every greedy output: no divergence to bound."""
        result = CliRunner().invoke(
            app, ["calibrate", "--config", str(config(env)), "--prompts", "4"]
        )
        assert result.exit_code == 3, result.output
        assert "A/A (baseline twice)" in result.stdout
        assert "A/B (speculative)" in result.stdout
        assert "not stored: 0 divergences measured, 119 needed" in result.stdout

    def test_the_aa_run_repeats_the_baseline_on_the_control_arm(self, env: Path) -> None:
        """With an A/A control arm configured, the baseline's second run goes to it (a
        replica on other hardware): here a control that corrupts every output gives 4
        A/A divergences (unmeasured: the fake engine lists no log-probs), the healthy
        speculative arm none, and both the JSON and the table name the control arm."""
        path = env / "canaryd.toml"
        path.write_text(
            arms(0.0)
            + '[arms.control]\nkind = "fake"\nspeculative = true\nseed = 1\n'
            + "corrupt_rate = 1.0\n"
            + '[switch]\narm = "speculative"\n[gates.quality]\ncontrol_arm = "control"\n'
        )
        result = CliRunner().invoke(
            app, ["calibrate", "--config", str(path), "--prompts", "4", "--json"]
        )
        assert result.exit_code == 3, result.output
        data = json.loads(result.stdout)
        assert data["aa_arm"] == "control" and data["pairs"] == 8
        assert data["divergences"] == {"aa": 0, "ab": 0, "unmeasured": 4, "needed": 119}
        table = CliRunner().invoke(app, ["calibrate", "--config", str(path), "--prompts", "4"])
        assert "A/A (baseline and control arm control)" in table.stdout, table.output

    def test_a_bad_config_is_an_error(self, env: Path) -> None:
        path = env / "bad.toml"
        path.write_text("[arms.speculative]\nkind = 'nonsense'\n")
        result = CliRunner().invoke(app, ["calibrate", "--config", str(path)])
        assert result.exit_code == 2
        assert "canaryd: error:" in result.output
