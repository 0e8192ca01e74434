"""The bf16-against-fp32 benchmark on a tiny model built in code: every pair of both
bf16 arms is judged by the fp32 baseline as the daemon judges it (identical, tie, real),
nothing goes unjudged in process, and the JSON has what docs/gates.md quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bf16_ties
from engine.testing import chaotic_llama


@pytest.fixture(scope="module")
def chaotic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Llama with large random weights: its logits are far apart, so bf16
    rounding moves some of its greedy choices and not others."""
    directory = tmp_path_factory.mktemp("chaotic")
    model, tokenizer = chaotic_llama(seed=3)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def test_every_divergence_is_judged_by_the_fp32_baseline(chaotic_dir: Path) -> None:
    result = bf16_ties.run(str(chaotic_dir), per_category=2, max_tokens=12)
    json.dumps(result)
    assert result["prompts"] == 18 and result["tie_margin_nats"] == 0.5
    assert set(result["arms"]) == {
        "bf16-autoregressive",
        "bf16-prompt-lookup",
        "bf16-prompt-lookup vs bf16-autoregressive",
    }
    for row in result["arms"].values():
        # the two rag prompts exceed the tiny model's 1,024-token context: they fail on
        # every arm and are never judged
        assert row["pairs"] + row["failed"] == 18 and row["failed"] == 2
        assert row["identical"] + row["diverged"] == row["pairs"]
        assert row["ties"] + row["real"] + row["unjudged"] == row["diverged"]
        assert row["unjudged"] == 0  # the in-process baseline scores every divergence
        if row["diverged"]:
            assert row["margin_max"] is not None and row["margin_max"] >= 0
            assert (row["real"] > 0) == (row["margin_max"] > 0.5)
    # bf16 rounding moves this model's greedy choices: the judged branch above ran
    assert result["arms"]["bf16-autoregressive"]["diverged"] > 0
    assert "bf16-prompt-lookup" in bf16_ties.table(result)
