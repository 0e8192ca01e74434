"""Three arms on the embedded model through `canaryd once --pairs 9 --json`: the baseline
and two prompt-lookup arms with different draft lengths, every arm lossless under greedy
decoding on every prompt, each reporting its acceptance, and the ratio between them."""

from __future__ import annotations

from pathlib import Path

import pytest

from canaryd import paths
from engine.provision import require_embedded_model
from tests.support.arms import assert_lossless_arms, once_json

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
max_tokens = 24
timeout_s = 900.0  # a loaded CI machine is slow; a timeout here would say nothing of arms
"""


def test_three_arms_once_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine prompts on three arms: each speculative arm's output equals the baseline's
    token for token, reports its verify steps and per-position acceptance within its own
    draft length, and the summary's ratio is the two arms' mean acceptance lengths."""
    require_embedded_model(paths.models_dir())
    data = once_json(THREE_ARMS, 9, tmp_path, monkeypatch)
    assert_lossless_arms(data, "lookup8", "lookup4", 9)
    for pair in data["pairs"]:
        for name, arm in pair["arms"].items():
            assert len(arm["drafted_per_position"] or []) <= int(name.removeprefix("lookup"))
    summary = data["summary"]
    assert summary["all"] == summary["arms"]["lookup8"]["all"]
