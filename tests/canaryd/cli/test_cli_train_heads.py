"""`canaryd models train-heads` end to end on a tiny model directory built in code."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from canaryd.cli.app import app
from engine.heads.model import read_metadata
from engine.testing import tiny_llama


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    threads = torch.get_num_threads()  # the command sets torch's threads for the process
    yield tmp_path
    torch.set_num_threads(threads)


class TestTrainHeads:
    @pytest.mark.slow  # trains heads of both kinds
    def test_quick_training_prints_accuracy_per_head_and_saves_both_kinds(self, env: Path) -> None:
        """--quick trains both kinds for a model directory, prints the held-out top-1
        accuracy per head position for each, and leaves the heads in the data dir."""
        model, tokenizer = tiny_llama(seed=0)
        model_dir = env / "tiny-model"
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        result = CliRunner().invoke(
            app,
            ["models", "train-heads", "--quick", "--model", str(model_dir), "--depth", "2"],
        )
        assert result.exit_code == 0, result.output
        out = result.stdout
        assert re.search(r"^kind\s+head 1\s+head 2\s+chain length$", out, re.M)
        assert re.search(r"^independent\s+\d+\.\d%\s+\d+\.\d%\s+\d\.\d\d$", out, re.M)
        assert re.search(r"^causal\s+\d+\.\d%\s+\d+\.\d%\s+\d\.\d\d$", out, re.M)
        assert "causal / independent chain length" in out
        for kind in ("causal", "independent"):
            meta = read_metadata(env / "data" / "models" / "heads" / "tiny-model" / kind)
            assert meta is not None and meta.depth == 2 and meta.training["plan"] == "quick"

    def test_a_missing_model_is_one_line(self, env: Path) -> None:
        result = CliRunner().invoke(
            app, ["models", "train-heads", "--quick", "--model", str(env / "nowhere")]
        )
        assert result.exit_code == 2
        assert "no model at" in result.stderr and "Traceback" not in result.output
