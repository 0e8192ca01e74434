"""Draft heads on the embedded SmolLM2-135M-Instruct: trained here on a small budget,
loaded from disk like `canaryd models train-heads` leaves them, lossless on every
shipped prompt for both kinds, and run as two speculative arms of one `canaryd once`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from canaryd import paths
from canaryd.pairs.suites import load_default_suites
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.heads.data import DataPlan, SeedPrompt
from engine.heads.model import HeadsMetadata
from engine.heads.train import TrainPlan, train_model_heads
from engine.hf import TransformersEngine
from engine.provision import EMBEDDED, require_embedded_model
from engine.types import GenerationRequest, SamplingParams
from gates.records import Prompt
from tests.support.arms import assert_lossless_arms, once_json

pytestmark = [pytest.mark.model, pytest.mark.slow]

SHIPPED = [prompt for suite in load_default_suites() for prompt in suite.prompts]
# Lossless decoding is checked on every shipped prompt with tiny heads in
# tests/engine/heads/test_decode.py; on the embedded model two prompts of each category
# (18 of 170) make the point in a tenth of the time (it took 19 minutes of CI on all).
PER_CATEGORY = 2


def by_category(prompts: list[Prompt], per_category: int) -> list[Prompt]:
    """The first `per_category` prompts of each category, in suite order."""
    chosen: list[Prompt] = []
    for prompt in prompts:
        if sum(1 for p in chosen if p.category == prompt.category) < per_category:
            chosen.append(prompt)
    return chosen


TINY_BUDGET = TrainPlan(
    name="test",
    data=DataPlan(temperatures=(0.0,), max_new_tokens=16, batch_size=48),
    depth=3,
    vocab_limit=1024,
    epochs=1,
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """On a CPU shared with other jobs one torch thread decodes several times faster
    than two (whose pool stalls on every step)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory's models directory holding (a link to) the pulled embedded
    model, no heads."""
    real = require_embedded_model(paths.models_dir())
    root = tmp_path_factory.mktemp("data") / "models"
    root.mkdir()
    (root / EMBEDDED.name).symlink_to(real, target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def trained(models_dir: Path) -> dict[str, HeadsMetadata]:
    # Eight prompts of each category (72 of 170): the loop and the files are what is tested
    # here, and the full suite cost CI over two minutes more.
    prompts = [SeedPrompt(p.category, p.messages) for p in by_category(SHIPPED, 8)]
    saved = train_model_heads("embedded", models_dir, prompts, TINY_BUDGET, device="cpu")
    return {kind: metadata for kind, metadata in saved.items()}


def arm(models_dir: Path, speculative: SpeculativeConfig | None) -> TransformersEngine:
    config = TransformersEngineConfig(device="cpu", speculative=speculative, warmup_tokens=0)
    engine = TransformersEngine(config, models_dir=models_dir)
    engine.load()
    return engine


def heads_arm(models_dir: Path, causal: bool) -> TransformersEngine:
    spec = SpeculativeConfig(method="draft_heads", causal=causal, tree_topk=(3, 2, 1))
    return arm(models_dir, spec)


class TestEmbeddedDraftHeads:
    def test_training_reports_held_out_accuracy_per_head(
        self, trained: dict[str, Any], models_dir: Path
    ) -> None:
        """Both kinds are saved with their sha256 and held-out accuracy per head."""
        for kind in ("causal", "independent"):
            meta = trained[kind]
            assert meta.kind == kind and meta.depth == 3 and len(meta.sha256) == 64
            accuracy = meta.training["held_out_accuracy"]
            assert len(accuracy) == 3 and all(0.0 <= a <= 1.0 for a in accuracy)
            assert accuracy[0] > 0.05  # far above chance over a 1024-token vocabulary
            assert (models_dir / "heads" / EMBEDDED.name / kind / "heads.safetensors").is_file()

    def test_greedy_output_equals_baseline_in_every_category(
        self, trained: dict[str, Any], models_dir: Path
    ) -> None:
        """Causal and independent heads with trees reproduce the baseline's tokens on
        two prompts of every shipped category, and count acceptance inside the loop."""
        base = arm(models_dir, None)
        causal, independent = heads_arm(models_dir, True), heads_arm(models_dir, False)
        accepted = {"causal": 0, "independent": 0}
        prompts = by_category(SHIPPED, PER_CATEGORY)
        assert len({p.category for p in prompts}) == len({p.category for p in SHIPPED})
        for prompt in prompts:
            request = GenerationRequest(
                messages=prompt.messages, sampling=SamplingParams(max_tokens=10)
            )
            expected = base.generate(request)
            assert expected.ok, expected.error_detail
            for name, engine in (("causal", causal), ("independent", independent)):
                result = engine.generate(request)
                assert result.token_ids == expected.token_ids, (name, prompt.id)
                stats = result.speculative
                assert stats is not None and result.draft_cost is not None
                assert result.output_tokens == stats.accepted_tokens + stats.verify_steps
                accepted[name] += stats.accepted_tokens
        assert accepted["causal"] > 0 and accepted["independent"] > 0
        assert int(causal.identity["draft_bytes"]) > 0


def _heads_arm(name: str, causal: bool) -> str:
    return (
        f'[arms.{name}]\nmodel = "embedded"\ndevice = "cpu"\n[arms.{name}.speculative]\n'
        f'method = "draft_heads"\ncausal = {str(causal).lower()}\ntree_topk = [3, 2, 1]\n'
    )


HYDRA_MEDUSA = (
    '[arms.baseline]\nmodel = "embedded"\ndevice = "cpu"\n'
    + _heads_arm("hydra", causal=True)
    + _heads_arm("medusa", causal=False)
    + '[switch]\narm = "hydra"\n[prompts]\nmax_tokens = 24\n'
    # a loaded CI machine is slow; a timeout here would say nothing of arms
    + "timeout_s = 900.0\n"
)


def test_hydra_and_medusa_arms_in_one_once_run(
    trained: dict[str, Any],
    models_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`canaryd once --pairs 9 --json` with the baseline, causal (`hydra`) and independent
    (`medusa`) heads loaded from the data directory: both head arms equal the baseline
    token for token on every pair, both report acceptance per draft position from the
    decoding loop with their drafting time, and the summary carries hydra's acceptance
    length over medusa's."""
    monkeypatch.setenv("CANARYD_DATA_DIR", str(models_dir.parent))
    data = once_json(HYDRA_MEDUSA, 9, tmp_path, monkeypatch)
    assert_lossless_arms(data, "hydra", "medusa", 9)
    for pair in data["pairs"]:
        for arm in pair["arms"].values():
            assert 0 < len(arm["drafted_per_position"]) <= 3
            assert arm["draft_s"] > 0 and arm["tree_tokens"] > 0 and 0 < arm["draft_share"] < 1
