"""`canaryd calibrate` end to end on fake engines and a real SQLite file: prompts run greedy
three times each, the JSON and the table say what was seen; with too few divergent A/A
pairs (a baseline that reproduces itself, whatever the speculative arm does, or
divergences no teacher can judge) nothing is stored and the command exits 3."""

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
        fake engine scores nothing and lists no log-probs), and the baseline reproduces
        itself: no A/A divergence, so no bound: exit 3."""
        path = config(env, corrupt_rate=1.0)
        result = CliRunner().invoke(
            app, ["calibrate", "--config", str(path), "--prompts", "6", "--json"]
        )
        assert result.exit_code == 3, result.output
        data = json.loads(result.stdout)
        empty = {"pairs": 6, "divergent_pairs": 0, "tokens": 0, "max_margin": None}
        assert data["aa"] == {"arm": "baseline", "unmeasured": 0, **empty}
        assert data["ab"] == {"arm": "speculative", "unmeasured": 6, **empty}
        assert data["prompts"] == 6 and data["failures"] == 0 and data["needed"] == 119
        assert data["bound"] is None and data["stored"] is False
        assert data["not_stored"].startswith("0 of 6 A/A pairs (the baseline against itself)")
        assert data["configured_margin"] == 0.5 and data["max_age_days"] == 30
        assert data["expires_at"] is None
        assert (data["coverage"], data["confidence"]) == (0.975, 0.95)
        assert "order statistic" in data["method"]
        settings = load_settings(path)
        assert data["arms"] == arm_key(settings, "speculative")
        with SqlStore.open(settings.storage.resolved_url()) as store:
            assert store.tie_margin(data["arms"]) is None

    def test_the_table_says_why_nothing_was_stored(self, env: Path) -> None:
        """Healthy fake arms agree on every greedy output: no divergence to bound, and the
        way out (an A/A control on other hardware, more prompts) is named."""
        result = CliRunner().invoke(
            app, ["calibrate", "--config", str(config(env)), "--prompts", "4"]
        )
        assert result.exit_code == 3, result.output
        assert "A/A (baseline twice): sets the margin" in result.stdout
        assert "A/B (speculative): information only" in result.stdout
        assert (
            "not stored: 0 of 4 A/A pairs (the baseline against itself) diverged with a "
            "measured margin, 119 needed: the baseline reproduced itself on every prompt"
        ) in result.stdout
        assert "gates.quality.control_arm" in result.stdout

    def test_the_default_runs_every_shipped_prompt(self, env: Path) -> None:
        """The bound needs 119 divergent A/A pairs of distinct prompts: by default every
        prompt of the shipped suites runs (170, fewer than the 400 asked for)."""
        result = CliRunner().invoke(app, ["calibrate", "--config", str(config(env)), "--json"])
        assert result.exit_code == 3, result.output
        data = json.loads(result.stdout)
        assert data["prompts"] == data["aa"]["pairs"] == 170

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
        assert data["aa"]["arm"] == "control" and data["aa"]["unmeasured"] == 4
        assert data["ab"]["unmeasured"] == 0 and data["ab"]["pairs"] == 4
        assert "the baseline against control arm 'control'" in data["not_stored"]
        table = CliRunner().invoke(app, ["calibrate", "--config", str(path), "--prompts", "4"])
        assert "A/A (baseline and control arm control)" in table.stdout, table.output

    def test_a_bad_config_is_an_error(self, env: Path) -> None:
        path = env / "bad.toml"
        path.write_text("[arms.speculative]\nkind = 'nonsense'\n")
        result = CliRunner().invoke(app, ["calibrate", "--config", str(path)])
        assert result.exit_code == 2
        assert "canaryd: error:" in result.output


class TestStoredMessage:
    def test_a_stored_margin_says_what_it_rests_on_and_until_when(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """150 divergent A/A pairs bound the margin: the JSON says so and when it
        expires, and the sentence a person reads names the A/A pairs, the arms, and the
        expiry with the key that sets it. (The fake engines measure no margin, so the
        stored case is driven from a calibration built of measured pairs.)"""
        from datetime import UTC, datetime

        from canaryd.cli.calibrate import _print, calibration_json
        from canaryd.judging.calibration import Calibration, RunDivergences
        from canaryd.scoring.calibrate import Measured
        from gates import GatesConfig

        at = datetime(2026, 3, 2, 10, 30, tzinfo=UTC)
        aa = RunDivergences.of("baseline", [Measured((i / 1000,)) for i in range(1, 151)])
        result = Calibration(
            "speculative", "key", "engines", aa, RunDivergences("speculative", 150), 150, 0, at
        )
        row = result.stored()
        assert row is not None
        body = calibration_json(result, True, GatesConfig())
        assert body["expires_at"] == "2026-04-01T10:30:00+00:00" and body["not_stored"] is None
        assert body["aa"]["divergent_pairs"] == 150 and body["bound"] == row.margin
        _print(body, row)
        out = " ".join(capsys.readouterr().out.split())
        assert (
            f"stored: {row.margin:.4g} nats for arms key (from 150 divergent A/A pairs; "
            "configured 0.5); the quality gate uses it for these arms and engines until "
            "2026-04-01T10:30:00+00:00 (gates.quality.tie_margin_max_age_days = 30)"
        ) in out
