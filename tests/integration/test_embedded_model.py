"""The embedded SmolLM2-135M-Instruct: prompt lookup is exact and its counts add up."""

from __future__ import annotations

import pytest

from canaryd import paths
from canaryd.pairs.suites import load_default_suites, select
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine
from engine.provision import require_embedded_model
from engine.types import GenerationRequest, SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def arms() -> tuple[TransformersEngine, TransformersEngine]:
    require_embedded_model(paths.models_dir())
    base = TransformersEngine(TransformersEngineConfig(), models_dir=paths.models_dir())
    spec = TransformersEngine(
        TransformersEngineConfig(speculative=SpeculativeConfig(num_draft_tokens=8)),
        models_dir=paths.models_dir(),
    )
    base.load()
    spec.load()
    return base, spec


def sample_prompts(per_category: int = 1) -> list:
    prompts = select(load_default_suites(), None)
    chosen, seen = [], {}
    for prompt in prompts:
        if seen.get(prompt.category, 0) < per_category:
            chosen.append(prompt)
            seen[prompt.category] = seen.get(prompt.category, 0) + 1
    return chosen


class TestEmbeddedPromptLookup:
    def test_greedy_output_equals_baseline_and_identities_hold(
        self, arms: tuple[TransformersEngine, TransformersEngine]
    ) -> None:
        """Across every category, greedy prompt lookup reproduces the baseline tokens exactly,
        accepted ≤ drafted, per-position counts sum to accepted, and output = accepted + steps."""
        base, spec = arms
        for prompt in sample_prompts():
            request = GenerationRequest(
                messages=prompt.messages, sampling=SamplingParams(max_tokens=32)
            )
            b, s = base.generate(request), spec.generate(request)
            assert b.ok and s.ok, (b.error_detail, s.error_detail)
            assert s.token_ids == b.token_ids, prompt.id
            stats = s.speculative
            assert stats is not None
            assert stats.accepted_tokens <= stats.draft_tokens
            assert sum(stats.accepted_per_position) == stats.accepted_tokens
            assert s.output_tokens == stats.accepted_tokens + stats.verify_steps
            assert s.acceptance_length is not None and 1.0 <= s.acceptance_length <= 9.0
            assert b.ttft_s is not None and s.ttft_s is not None
            assert 0 < b.ttft_s <= b.e2e_s and 0 < s.ttft_s <= s.e2e_s

    def test_seeded_sampling_matches_between_runs(
        self, arms: tuple[TransformersEngine, TransformersEngine]
    ) -> None:
        """Sampling with a seed repeats itself on the same arm."""
        base, _ = arms
        prompt = sample_prompts()[0]
        request = GenerationRequest(
            messages=prompt.messages,
            sampling=SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=42),
        )
        assert base.generate(request).token_ids == base.generate(request).token_ids
