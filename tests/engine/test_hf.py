"""The in-process transformers engine on a tiny random Llama built in code."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine
from engine.testing import tiny_llama
from engine.types import ErrorKind, GenerationRequest, GenerationResult, Message, SamplingParams

COPYING_PROMPT = (
    "Rewrite the sentence exactly: the quick brown fox jumps over the lazy dog. "
    "the quick brown fox jumps over the lazy dog. the quick brown fox"
)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def tiny_draft(tiny: tuple[Any, Any]) -> Any:
    model, _tokenizer = tiny_llama(seed=1, layers=1, tokenizer=tiny[1])
    return model


def engine(
    tiny: tuple[Any, Any], speculative: SpeculativeConfig | None = None, draft: Any = None
) -> TransformersEngine:
    model, tokenizer = tiny
    config = TransformersEngineConfig(model="tiny", speculative=speculative, warmup_tokens=2)
    e = TransformersEngine(config, model=model, tokenizer=tokenizer, draft_model=draft)
    e.load()
    return e


def request(text: str = COPYING_PROMPT, max_tokens: int = 24, **sampling: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("user", text),),
        sampling=SamplingParams(max_tokens=max_tokens, **sampling),
    )


SPECULATIVE_METHODS = {
    "prompt_lookup": SpeculativeConfig(method="prompt_lookup", num_draft_tokens=4),
    "draft_model": SpeculativeConfig(
        method="draft_model", draft_model="tiny-draft", num_draft_tokens=3
    ),
    "early_exit": SpeculativeConfig(method="early_exit", early_exit_layer=1, num_draft_tokens=3),
    "prompt_lookup_adaptive": SpeculativeConfig(
        method="prompt_lookup", num_draft_tokens=4, adaptive=True
    ),
}


class TestBaselineArm:
    def test_generates_up_to_max_tokens_with_consistent_timings(self, tiny: Any) -> None:
        """A baseline generation reports tokens, finish reason and TTFT ≤ end-to-end."""
        result = engine(tiny).generate(request(max_tokens=16))
        assert result.ok
        assert 1 <= result.output_tokens <= 16
        assert result.output_tokens == len(result.token_ids)
        assert result.finish_reason in {"stop", "length"}
        assert result.ttft_s is not None and 0 < result.ttft_s <= result.e2e_s
        assert result.tpot_s is not None and result.tpot_s > 0
        assert result.speculative is None
        assert result.acceptance_length is None

    def test_itl_has_one_gap_per_token(self, tiny: Any) -> None:
        """Autoregressive decoding delivers one token at a time: every gap is a chunk's,
        none is zero, and the slowest is no longer than decoding after the first token."""
        result = engine(tiny).generate(request(max_tokens=16))
        itl = result.itl
        assert itl is not None and result.ok
        assert (itl.tokens, itl.chunks) == (result.output_tokens - 1, result.output_tokens - 1)
        assert min(itl.token_gaps()) > 0
        assert result.ttft_s is not None and itl.max_s <= result.e2e_s - result.ttft_s

    def test_multi_turn_messages_go_through_the_chat_template(self, tiny: Any) -> None:
        """Earlier turns are part of the prompt: more messages, more prompt tokens."""
        e = engine(tiny)
        one = e.generate(request("hello", max_tokens=4))
        three = e.generate(
            GenerationRequest(
                messages=(
                    Message("system", "be brief"),
                    Message("user", "hello"),
                    Message("assistant", "hi there"),
                    Message("user", "hello"),
                ),
                sampling=SamplingParams(max_tokens=4),
            )
        )
        assert three.prompt_tokens > one.prompt_tokens

    def test_empty_prompt_is_an_invalid_request(self, tiny: Any) -> None:
        """Whitespace-only input is rejected as `invalid`, not sent to the model."""
        result = engine(tiny).generate(request("   "))
        assert result.error is ErrorKind.INVALID
        assert not result.ok

    def test_over_long_prompt_is_an_invalid_request(self, tiny: Any) -> None:
        """A prompt beyond the model's context fails cleanly with the sizes in the detail."""
        result = engine(tiny).generate(request("fox " * 2000, max_tokens=8))
        assert result.error is ErrorKind.INVALID
        assert "exceeds the model's context of 1024" in result.error_detail

    def test_timeout_stops_generation_and_is_reported(self, tiny: Any) -> None:
        """A generation that runs past its timeout stops early and is marked `timeout`."""
        slow = GenerationRequest(
            messages=(Message("user", COPYING_PROMPT),),
            sampling=SamplingParams(max_tokens=500),
            timeout_s=1e-4,
        )
        result = engine(tiny).generate(slow)
        assert result.error is ErrorKind.TIMEOUT
        assert result.output_tokens < 500

    def test_seeded_sampling_is_reproducible(self, tiny: Any) -> None:
        """The same seed gives the same sample; a different seed gives a different one."""
        e = engine(tiny)
        first = e.generate(request(max_tokens=24, temperature=1.5, seed=7))
        again = e.generate(request(max_tokens=24, temperature=1.5, seed=7))
        other = e.generate(request(max_tokens=24, temperature=1.5, seed=8))
        assert first.token_ids == again.token_ids
        assert first.token_ids != other.token_ids


@pytest.mark.parametrize("method", sorted(SPECULATIVE_METHODS))
class TestSpeculativeArm:
    def test_greedy_output_equals_baseline(self, tiny: Any, tiny_draft: Any, method: str) -> None:
        """Greedy draft-verify decoding produces exactly the autoregressive tokens."""
        spec = engine(tiny, SPECULATIVE_METHODS[method], draft=tiny_draft)
        base = engine(tiny)
        for text in (COPYING_PROMPT, "Translate into French: the cat sleeps on the mat."):
            assert spec.generate(request(text)).token_ids == base.generate(request(text)).token_ids

    def test_acceptance_counts_obey_their_identities(
        self, tiny: Any, tiny_draft: Any, method: str
    ) -> None:
        """accepted ≤ drafted, per-position counts sum up, output = accepted + steps."""
        config = SPECULATIVE_METHODS[method]
        result = engine(tiny, config, draft=tiny_draft).generate(request(max_tokens=32))
        stats = result.speculative
        assert stats is not None and result.ok
        assert stats.verify_steps >= 1
        assert stats.accepted_tokens <= stats.draft_tokens
        assert sum(stats.accepted_per_position) == stats.accepted_tokens
        assert sum(stats.drafted_per_position) == stats.draft_tokens
        assert len(stats.accepted_per_position) >= config.num_draft_tokens
        assert result.output_tokens == stats.accepted_tokens + stats.verify_steps
        assert 1.0 <= (result.acceptance_length or 0) <= config.num_draft_tokens + 1
        accepted = stats.accepted_per_position
        assert all(a >= b for a, b in itertools.pairwise(accepted)), (
            "a draft position is only accepted when every earlier one was"
        )

    def test_itl_has_one_delivery_per_verify_step(
        self, tiny: Any, tiny_draft: Any, method: str
    ) -> None:
        """Each verify step's emitted tokens arrive together: one delivery a step, a gap
        for every token after the first, and the gaps within the generation's time."""
        result = engine(tiny, SPECULATIVE_METHODS[method], draft=tiny_draft).generate(
            request(max_tokens=32)
        )
        stats, itl = result.speculative, result.itl
        assert stats is not None and itl is not None and result.ok
        assert len(itl.arrivals) == stats.verify_steps
        assert sum(n for _, n in itl.arrivals) == result.output_tokens
        assert itl.tokens == result.output_tokens - 1
        assert 0 <= itl.p50_s <= itl.p99_s <= itl.max_s <= result.e2e_s


class TestPromptLookupDrafting:
    def test_copying_prompt_accepts_more_than_one_token_per_step(self, tiny: Any) -> None:
        """On text that repeats its prompt, prompt lookup verifies several tokens a step."""
        spec = engine(tiny, SPECULATIVE_METHODS["prompt_lookup"])
        result = spec.generate(request(max_tokens=32))
        assert result.acceptance_length is not None and result.acceptance_length > 1.0

    def test_identity_names_method_and_draft_length(self, tiny: Any) -> None:
        """The engine identity stored with a run says how the speculative arm drafts."""
        ident = engine(tiny, SPECULATIVE_METHODS["prompt_lookup"]).identity
        assert ident["mode"] == "speculative"
        assert ident["method"] == "prompt_lookup"
        assert ident["num_draft_tokens"] == "4"


class TestEarlyExitConfig:
    def test_exit_layer_beyond_the_model_is_a_config_error(self, tiny: Any) -> None:
        """An early-exit layer the model does not have fails at load, naming the key."""
        from engine.errors import EngineConfigError

        model, tokenizer = tiny
        config = TransformersEngineConfig(
            model="tiny", speculative=SpeculativeConfig(method="early_exit", early_exit_layer=9)
        )
        with pytest.raises(EngineConfigError, match="early_exit_layer"):
            TransformersEngine(config, model=model, tokenizer=tokenizer).load()


class _LookupDrafter:
    """Stands in for transformers' prompt-lookup generator: drafts `num_output_tokens`."""

    def __init__(self, k: int) -> None:
        self.num_output_tokens = k

    def get_candidates(self, input_ids: Any, **kwargs: Any) -> tuple[Any, None]:
        import torch

        draft = torch.zeros((1, self.num_output_tokens), dtype=input_ids.dtype)
        return torch.cat([input_ids, draft], dim=1), None

    def update_candidate_strategy(self, input_ids: Any, scores: Any, num_matches: int) -> None:
        pass


class TestAdaptiveDraftLength:
    def test_draft_length_follows_acceptance_within_bounds(self) -> None:
        """After a rejection k drops by one (not below 1); after a full accept it grows by
        two (not above the configured k)."""
        import torch

        from engine.hf_hooks import AcceptanceCounter, RecordingCandidateGenerator

        inner = _LookupDrafter(4)
        wrapped = RecordingCandidateGenerator(inner, AcceptanceCounter(adaptive_max=4))
        prompt = torch.zeros((1, 3), dtype=torch.long)
        lengths = []
        for accepted_fraction in (0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0):
            wrapped.get_candidates(prompt)
            drafted = inner.num_output_tokens
            wrapped.update_candidate_strategy(prompt, prompt, int(drafted * accepted_fraction))
            lengths.append(inner.num_output_tokens)
        assert lengths == [3, 2, 1, 1, 3, 4, 4]

    def test_fixed_draft_length_is_untouched(self) -> None:
        """Without `adaptive`, k stays what was configured whatever is accepted."""
        import torch

        from engine.hf_hooks import AcceptanceCounter, RecordingCandidateGenerator

        inner = _LookupDrafter(4)
        wrapped = RecordingCandidateGenerator(inner, AcceptanceCounter())
        prompt = torch.zeros((1, 3), dtype=torch.long)
        for _ in range(3):
            wrapped.get_candidates(prompt)
            wrapped.update_candidate_strategy(prompt, prompt, 0)
        assert inner.num_output_tokens == 4


@pytest.fixture(scope="module")
def peaked() -> tuple[Any, Any]:
    """A tiny model with sharper next-token distributions (logits scaled 5x through the
    final norm): a near-uniform random model leaves argmax nothing to favour."""
    import torch

    model, tokenizer = tiny_llama(seed=0)
    with torch.no_grad():
        model.model.norm.weight.mul_(5.0)
    return model, tokenizer


class TestGreedyVerifyFault:
    """The drill fault: verifying by argmax while sampling changes the distribution."""

    FAULTY = SpeculativeConfig(method="prompt_lookup", num_draft_tokens=4, fault="greedy_verify")
    HEALTHY = SpeculativeConfig(method="prompt_lookup", num_draft_tokens=4)

    def test_off_by_default(self) -> None:
        assert SpeculativeConfig().fault is None

    def test_identity_names_the_fault(self, tiny: Any) -> None:
        assert engine(tiny, self.FAULTY).identity["fault"] == "greedy_verify"
        assert "fault" not in engine(tiny, self.HEALTHY).identity

    def test_greedy_output_is_unchanged(self, tiny: Any) -> None:
        """At temperature 0 argmax verification is the correct rule: no difference."""
        faulty, base = engine(tiny, self.FAULTY), engine(tiny)
        assert faulty.generate(request()).token_ids == base.generate(request()).token_ids

    def test_sampled_outputs_lean_to_the_targets_argmax(self, peaked: Any) -> None:
        """Across seeds the faulty arm's samples hold an excess of the target's argmax tokens
        and are likelier under it than the healthy arm's and plain sampling's."""
        base = engine(peaked)
        healthy, faulty = engine(peaked, self.HEALTHY), engine(peaked, self.FAULTY)

        def mean_scores(arm: TransformersEngine) -> tuple[float, float]:
            nll, excess = [], []
            for seed in range(16):
                result = arm.generate(request(max_tokens=24, temperature=1.0, seed=seed))
                score = base.score(request().messages, result)
                assert score is not None and score.tokens == len(result.token_ids)
                nll.append(score.mean_nll)
                excess.append(score.argmax_excess)
            return sum(nll) / len(nll), sum(excess) / len(excess)

        (plain_nll, plain_excess), (lossless_nll, lossless_excess), (lossy_nll, lossy_excess) = (
            mean_scores(base),
            mean_scores(healthy),
            mean_scores(faulty),
        )
        assert lossy_nll < min(plain_nll, lossless_nll) - 0.4
        assert lossy_excess > max(plain_excess, lossless_excess) + 0.2


class TestScore:
    def test_score_is_the_mean_token_nll_of_the_output(self, tiny: Any) -> None:
        e = engine(tiny)
        result = e.generate(request(max_tokens=8))
        score = e.score(request().messages, result)
        assert score is not None and score.mean_nll > 0 and score.tokens == 8
        assert 0.0 <= score.argmax_share <= 1.0 and 0.0 < score.mean_top_probability <= 1.0
        assert e.score(request().messages, GenerationResult.failed(ErrorKind.HTTP, "x", 0)) is None

    def test_greedy_output_is_all_argmax(self, tiny: Any) -> None:
        """A greedy output is the teacher's argmax at every position."""
        e = engine(tiny)
        score = e.score(request().messages, e.generate(request(max_tokens=8)))
        assert score is not None and score.argmax_share == 1.0
        assert score.argmax_excess == pytest.approx(1.0 - score.mean_top_probability)

    def test_text_without_ids_is_retokenised(self, tiny: Any) -> None:
        """An output that carries text but no ids (an HTTP arm's) is scored by its text."""
        e = engine(tiny)
        result = e.generate(request(max_tokens=8))
        by_text = e.score(request().messages, replace(result, token_ids=()))
        assert by_text is not None and by_text.tokens == len(e.count_tokens(result.text))

    def test_the_greedy_first_token_is_the_likeliest(self, peaked: Any) -> None:
        e = engine(peaked)
        first = e.generate(request(max_tokens=1))

        def nll(token: int) -> float:
            score = e.score(request().messages, replace(first, token_ids=(token,)))
            assert score is not None
            return score.mean_nll

        greedy = first.token_ids[0]
        assert all(nll(greedy) < nll((greedy + k) % 300) for k in (1, 7, 50))


class TestGarbageSamplingFault:
    """The #27 drill: verified tokens replaced by random ones while sampling."""

    GARBAGE = SpeculativeConfig(
        method="prompt_lookup", num_draft_tokens=4, fault="garbage_sampling", fault_rate=1.0
    )

    def test_greedy_output_is_unchanged(self, tiny: Any) -> None:
        garbage, base = engine(tiny, self.GARBAGE), engine(tiny)
        assert garbage.generate(request()).token_ids == base.generate(request()).token_ids

    def test_sampled_outputs_are_unlikely_under_the_target(self, peaked: Any) -> None:
        """Across seeds the garbage outputs are far less likely under the target than the
        same arm's without the fault (the tiny model's small vocabulary makes a random
        token only moderately unlikely; the embedded model's figures are in docs/gates.md),
        and every score carries its worst token."""
        base = engine(peaked)
        healthy = engine(peaked, self.GARBAGE.model_copy(update={"fault": None}))
        garbage = engine(peaked, self.GARBAGE)

        def likelihood(arm: TransformersEngine) -> float:
            nll = []
            for seed in range(8):
                result = arm.generate(request(max_tokens=24, temperature=1.0, seed=seed))
                score = base.score(request().messages, result)
                assert score is not None and score.max_nll is not None
                assert score.max_nll >= score.mean_nll
                nll.append(score.mean_nll)
            return sum(nll) / len(nll)

        assert likelihood(garbage) > likelihood(healthy) + 1.0

    def test_not_with_draft_heads(self) -> None:
        with pytest.raises(ValueError, match="garbage_sampling"):
            SpeculativeConfig(method="draft_heads", fault="garbage_sampling")
