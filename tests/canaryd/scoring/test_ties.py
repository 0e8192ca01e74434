"""Numeric ties are not bugs: greedy pairs on the tiny model, the speculative arm (prompt
lookup) with the `numeric_noise` drill fault, a stand-in for bf16 kernels. Where the
outputs diverge, the baseline model scores the first divergent token: small noise makes
ties only and the quality gate never fails; noise the size of a real kernel bug makes real
divergences and the gate fails."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from canaryd.pairs.runner import PairParams, PairRunner
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine
from engine.testing import tiny_llama
from engine.types import Message
from gates.config import QualityGateConfig
from gates.core import GateState
from gates.pairs.quality import quality_gate
from gates.records import PairRecord, Prompt
from gates.stats.budget import DEFAULT_ARL0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_llama(seed=0)


def run(tiny: tuple[Any, Any], noise: float, pairs: int) -> list[PairRecord]:
    model, tokenizer = tiny
    baseline = TransformersEngine(
        TransformersEngineConfig(model="tiny", warmup_tokens=2), model=model, tokenizer=tokenizer
    )
    spec = SpeculativeConfig(method="prompt_lookup", num_draft_tokens=4, numeric_noise=noise)
    speculative = TransformersEngine(
        TransformersEngineConfig(model="tiny", speculative=spec, warmup_tokens=2),
        model=model,
        tokenizer=tokenizer,
    )
    runner = PairRunner(
        baseline, speculative, run_id="ties", seed=1, params=PairParams(max_tokens=12)
    )
    return [runner.run_pair(prompt(i)) for i in range(pairs)]


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "cat",
    "sleeps",
    "river",
    "stone",
    "light",
]


def prompt(index: int) -> Prompt:
    """A short prompt of its own per index (the tiny model's context is small)."""
    words = [WORDS[(index * 7 + k * 3) % len(WORDS)] for k in range(6 + index % 5)]
    return Prompt(f"tie-{index}", "qa", (Message("user", " ".join(words)),), 12)


class TestNumericTies:
    def test_small_noise_diverges_only_in_ties_and_never_fails(self, tiny: tuple[Any, Any]) -> None:
        """Logit noise of ±0.4 (the tiny random model's top two logits are usually further
        apart): every divergence is judged, within twice the noise, and a mismatch check
        whose tie margin covers that counts none of them."""
        records = run(tiny, noise=0.4, pairs=30)
        diverged = [r.scores for r in records if r.scores and not r.scores.exact_match]
        assert diverged, "the tiny model's near-uniform logits should tie somewhere"
        margins = [s.divergence_margin for s in diverged]
        assert all(m is not None and m <= 0.8 + 1e-4 for m in margins), margins
        config = QualityGateConfig(min_samples=10, tie_margin_nats=0.8)
        decision = quality_gate(records, config, now=datetime.now(UTC), arl0=DEFAULT_ARL0)
        mismatch = next(c for c in decision.components if c.name == "quality.mismatch")
        assert mismatch.state is not GateState.FAIL, mismatch.detail
        assert f"numeric ties {len(diverged)}/{len(records)}" in mismatch.detail

    def test_a_kernel_bug_sized_noise_is_a_real_divergence_and_fails(
        self, tiny: tuple[Any, Any]
    ) -> None:
        """Logit noise of ±30, far beyond the tiny model's whole logit range (a broken
        kernel: the chosen token is close to random): divergences beyond the tie margin,
        and the mismatch check FAILs."""
        records = run(tiny, noise=30.0, pairs=20)
        diverged = [r.scores for r in records if r.scores and not r.scores.exact_match]
        assert len(diverged) > len(records) // 2
        real = [s for s in diverged if not s.tie(0.8)]
        assert len(real) > len(diverged) // 2
        config = QualityGateConfig(min_samples=10, tie_margin_nats=0.8)
        decision = quality_gate(records, config, now=datetime.now(UTC), arl0=DEFAULT_ARL0)
        mismatch = next(c for c in decision.components if c.name == "quality.mismatch")
        assert mismatch.state is GateState.FAIL, mismatch.detail
