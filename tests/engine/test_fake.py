"""The fault-injecting fake engine: deterministic, consistent, and faulty on request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, Message, SamplingParams


def req(
    i: int, category: str = "qa", text: str = "tell me about canaries and mines"
) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("user", f"{text} {i}"),),
        request_id=f"r{i}",
        category=category,
        sampling=SamplingParams(max_tokens=64),
    )


class TestFakeEngine:
    def test_same_request_same_result(self) -> None:
        """A fake run is reproducible: the same seed and request give the same result."""
        a = FakeEngine(FakeEngineConfig(speculative=True)).generate(req(1))
        b = FakeEngine(FakeEngineConfig(speculative=True)).generate(req(1))
        assert a == b

    def test_a_sampled_request_is_a_draw_seeded_by_its_seed(self) -> None:
        """At temperature > 0 the words depend on the seed: the same seed gives the same
        words on both arms (a healthy pair with one seed matches), another seed other
        words of the same length; greedy requests ignore the seed."""

        def sampled(seed: int, temperature: float = 0.8, speculative: bool = False) -> str:
            request = GenerationRequest(
                messages=req(3).messages,
                sampling=SamplingParams(max_tokens=64, temperature=temperature, seed=seed),
            )
            return FakeEngine(FakeEngineConfig(speculative=speculative)).generate(request).text

        assert sampled(5) == sampled(5, speculative=True)
        assert sampled(5) != sampled(6)
        assert len(sampled(5).split()) == len(sampled(6).split())
        assert sampled(5, temperature=0.0) == sampled(6, temperature=0.0)

    def test_healthy_arms_agree_on_text(self) -> None:
        """A healthy baseline and speculative fake produce the same tokens for a prompt."""
        base = FakeEngine(FakeEngineConfig()).generate(req(2))
        spec = FakeEngine(FakeEngineConfig(speculative=True)).generate(req(2))
        assert base.token_ids == spec.token_ids and base.ok and spec.ok

    def test_acceptance_identities_hold(self) -> None:
        """Synthetic acceptance obeys output = accepted + steps and per-position sums."""
        for i in range(50):
            r = FakeEngine(FakeEngineConfig(speculative=True)).generate(req(i))
            s = r.speculative
            assert s is not None
            assert r.output_tokens == s.accepted_tokens + s.verify_steps
            assert sum(s.accepted_per_position) == s.accepted_tokens
            assert sum(s.drafted_per_position) == s.draft_tokens
            assert s.accepted_tokens <= s.draft_tokens
            assert r.itl is not None
            assert len(r.itl.arrivals) == s.verify_steps
            assert r.itl.tokens == r.output_tokens - 1

    def test_per_category_acceptance_drift(self) -> None:
        """A lower acceptance rate for one category lowers only its acceptance length."""
        config = FakeEngineConfig(
            speculative=True, acceptance_rate=0.8, acceptance_rate_by_category={"math": 0.3}
        )
        engine = FakeEngine(config)

        def mean_length(category: str) -> float:
            lengths = [engine.generate(req(i, category)).acceptance_length for i in range(200)]
            return sum(x for x in lengths if x) / len(lengths)

        assert mean_length("math") < 0.7 * mean_length("qa")

    def test_injected_error_rate_is_close_to_configured(self) -> None:
        """error_rate 0.2 fails about a fifth of requests with an HTTP 503."""
        engine = FakeEngine(FakeEngineConfig(error_rate=0.2, seed=3))
        results = [engine.generate(req(i)) for i in range(1000)]
        errors = [r for r in results if r.error is ErrorKind.HTTP]
        assert 150 < len(errors) < 250
        assert all(r.http_status == 503 for r in errors)

    def test_corruption_changes_output(self) -> None:
        """corrupt_rate 1 alters every output so it no longer matches the baseline."""
        base = FakeEngine(FakeEngineConfig()).generate(req(5))
        bad = FakeEngine(FakeEngineConfig(speculative=True, corrupt_rate=1.0)).generate(req(5))
        assert bad.token_ids != base.token_ids
        assert "CORRUPTED" in bad.text

    def test_latency_factor_scales_timings(self) -> None:
        """latency_factor 1.5 makes every request 1.5 times slower."""
        fast = FakeEngine(FakeEngineConfig()).generate(req(6))
        slow = FakeEngine(FakeEngineConfig(latency_factor=1.5)).generate(req(6))
        assert abs(slow.e2e_s / fast.e2e_s - 1.5) < 1e-9

    def test_latency_factor_by_category_slows_only_that_category(self) -> None:
        """latency_factor_by_category {"math": 2} doubles math's timings, nothing else's."""
        config = FakeEngineConfig(speculative=True, latency_factor_by_category={"math": 2.0})
        for category, factor in (("math", 2.0), ("qa", 1.0)):
            plain = FakeEngine(FakeEngineConfig(speculative=True)).generate(req(6, category))
            slowed = FakeEngine(config).generate(req(6, category))
            assert abs(slowed.e2e_s / plain.e2e_s - factor) < 1e-9
            assert slowed.token_ids == plain.token_ids

    def test_a_category_factor_must_be_positive(self) -> None:
        with pytest.raises(ValidationError, match=r"latency_factor_by_category\['math'\] = 0.0"):
            FakeEngineConfig(latency_factor_by_category={"math": 0.0})

    def test_speculative_fake_is_faster_when_acceptance_is_high(self) -> None:
        """With 70 % acceptance of 4 drafted tokens the speculative fake is faster."""
        base = [FakeEngine(FakeEngineConfig()).generate(req(i)).e2e_s for i in range(100)]
        spec = [
            FakeEngine(FakeEngineConfig(speculative=True)).generate(req(i)).e2e_s
            for i in range(100)
        ]
        assert sum(base) / sum(spec) > 1.3


class TestGreedyBias:
    """The fake's `greedy_bias` knob: sampled speculative outputs the teacher likes more."""

    @staticmethod
    def sampled(i: int, temperature: float = 0.8) -> GenerationRequest:
        return GenerationRequest(
            messages=(Message("user", f"tell me about canaries and mines {i}"),),
            sampling=SamplingParams(max_tokens=64, temperature=temperature, seed=i),
        )

    def test_sampled_outputs_score_lower_nll_and_more_argmax(self) -> None:
        teacher = FakeEngine(FakeEngineConfig())
        biased = FakeEngine(FakeEngineConfig(speculative=True, greedy_bias=0.5))
        for i in range(10):
            request = self.sampled(i)
            base = teacher.score(request.messages, teacher.generate(request))
            spec = teacher.score(request.messages, biased.generate(request))
            assert base is not None and spec is not None
            assert spec.mean_nll < base.mean_nll
            assert spec.argmax_share > base.argmax_share

    def test_off_by_default_and_greedy_requests_are_untouched(self) -> None:
        assert FakeEngineConfig().greedy_bias == 0.0
        biased = FakeEngine(FakeEngineConfig(speculative=True, greedy_bias=1.0))
        healthy = FakeEngine(FakeEngineConfig(speculative=True))
        assert biased.generate(req(3)).token_ids == healthy.generate(req(3)).token_ids
        sampled = self.sampled(3)
        assert biased.generate(sampled).token_ids != healthy.generate(sampled).token_ids

    def test_score_of_nothing_is_none(self) -> None:
        nothing = GenerationResult.failed(ErrorKind.INVALID, "empty prompt", 0.0)
        assert FakeEngine(FakeEngineConfig()).score((Message("user", "x"),), nothing) is None

    def test_full_bias_is_all_argmax(self) -> None:
        """greedy_bias 1 swaps every word for the teacher's argmax word."""
        request = self.sampled(1)
        biased = FakeEngine(FakeEngineConfig(speculative=True, greedy_bias=1.0))
        score = FakeEngine(FakeEngineConfig()).score(request.messages, biased.generate(request))
        assert score is not None and score.argmax_share == 1.0
