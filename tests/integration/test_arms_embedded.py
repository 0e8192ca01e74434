"""Three arms on the embedded model through `canaryd once --pairs 9 --json`: the baseline
and two prompt-lookup arms with different draft lengths, every arm lossless under greedy
decoding on every prompt, each reporting its acceptance, and the ratio between them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd import paths
from canaryd.cli.app import app
from engine.provision import require_embedded_model

pytestmark = [pytest.mark.model, pytest.mark.slow]

THREE_ARMS = """
[arms.baseline]
model = "embedded"
device = "cpu"
[arms.lookup4]
model = "embedded"
device = "cpu"
[arms.lookup4.speculative]
method = "prompt_lookup"
num_draft_tokens = 4
[arms.lookup8]
model = "embedded"
device = "cpu"
[arms.lookup8.speculative]
method = "prompt_lookup"
num_draft_tokens = 8
[switch]
arm = "lookup8"
[prompts]
max_tokens = 32
timeout_s = 900.0  # a loaded CI machine is slow; a timeout here would say nothing of arms
"""


def test_three_arms_once_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine prompts on three arms: each speculative arm's output equals the baseline's
    token for token, reports its verify steps and per-position acceptance within its own
    draft length, and the summary's ratio is the two arms' mean acceptance lengths."""
    require_embedded_model(paths.models_dir())
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    config = tmp_path / "canaryd.toml"
    config.write_text(THREE_ARMS + f'[storage]\nurl = "sqlite:///{tmp_path / "canaryd.db"}"\n')
    result = CliRunner().invoke(app, ["once", "-c", str(config), "--pairs", "9", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["switch_arm"] == "lookup8" and len(data["pairs"]) == 9
    for pair in data["pairs"]:
        assert pair["baseline"]["error"] is None, pair["baseline"]["error_detail"]
        assert set(pair["arms"]) == {"lookup4", "lookup8"}
        for name, arm in pair["arms"].items():
            assert arm["error"] is None, arm["error_detail"]
            assert arm["scores"]["exact_match"] is True, (pair["prompt_id"], name)
            assert arm["text"] == pair["baseline"]["text"]
            assert arm["acceptance_source"] == "decoding_loop"
            assert arm["verify_steps"] > 0 and arm["acceptance_length"] >= 1.0
            assert len(arm["drafted_per_position"] or []) <= int(name.removeprefix("lookup"))
    summary = data["summary"]
    assert summary["all"] == summary["arms"]["lookup8"]["all"]
    [ratio] = summary["ratios"]
    assert (ratio["arm"], ratio["over"]) == ("lookup8", "lookup4")
    assert ratio["acceptance_length_mean"] == pytest.approx(
        summary["arms"]["lookup8"]["all"]["acceptance_length_mean"]
        / summary["arms"]["lookup4"]["all"]["acceptance_length_mean"]
    )
