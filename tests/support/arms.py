"""`canaryd once --pairs N --json` over several embedded-model arms, and the checks every
lossless speculative arm must pass there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app


def once_json(config_text: str, pairs: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run `once --json` on `config_text` (plus a SQLite store under `tmp_path`) and
    return the parsed JSON; the command must succeed."""
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    config = tmp_path / "canaryd.toml"
    config.write_text(config_text + f'[storage]\nurl = "sqlite:///{tmp_path / "canaryd.db"}"\n')
    result = CliRunner().invoke(app, ["once", "-c", str(config), "--pairs", str(pairs), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_lossless_arms(data: Any, switch_arm: str, other_arm: str, pairs: int) -> None:
    """Every pair has both speculative arms, each error-free, equal to the baseline token
    for token and reporting acceptance from the decoding loop; the summary's one ratio is
    `switch_arm`'s mean acceptance length over `other_arm`'s."""
    assert data["switch_arm"] == switch_arm and len(data["pairs"]) == pairs
    for pair in data["pairs"]:
        assert pair["baseline"]["error"] is None, pair["baseline"]["error_detail"]
        assert set(pair["arms"]) == {switch_arm, other_arm}
        for name, arm in pair["arms"].items():
            assert arm["error"] is None, arm["error_detail"]
            assert arm["scores"]["exact_match"] is True, (pair["prompt_id"], name)
            assert arm["text"] == pair["baseline"]["text"]
            assert arm["acceptance_source"] == "decoding_loop"
            assert arm["verify_steps"] > 0 and arm["acceptance_length"] >= 1.0
    summary = data["summary"]
    [ratio] = summary["ratios"]
    assert (ratio["arm"], ratio["over"]) == (switch_arm, other_arm)
    assert ratio["acceptance_length_mean"] == pytest.approx(
        summary["arms"][switch_arm]["all"]["acceptance_length_mean"]
        / summary["arms"][other_arm]["all"]["acceptance_length_mean"]
    )
