"""Live pairs: the source mix, a live request replayed with its own sampling on every
arm, what is stored of it, and the traffic mix of a window."""

from __future__ import annotations

from dataclasses import dataclass, field

from canaryd.metrics import CanarydMetrics
from canaryd.pairs.runner import PairRunner
from canaryd.traffic import LiveSampler, SamplingBounds
from canaryd.traffic.live import SourceMix, live_prompt, own_sampling, stored_record
from canaryd.traffic.mix import ngram_repetition, window_mix
from canaryd.traffic.requests import LiveRequest, prompt_hash
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import GenerationRequest, GenerationResult, Message

KEY = b"k" * 32


def request(text: str = "tell me about zebras", category: str = "support") -> LiveRequest:
    messages = (Message(role="user", content=text),)
    return LiveRequest(
        category=category,
        messages=messages,
        temperature=0.7,
        top_p=0.9,
        max_tokens=24,
        stop=("\n\n",),
        prompt_hash=prompt_hash(KEY, messages),
    )


@dataclass
class Recording:
    """An engine that keeps every request it is sent, answering as `inner` does."""

    inner: FakeEngine
    requests: list[GenerationRequest] = field(default_factory=list)

    @property
    def identity(self) -> dict[str, str]:
        return self.inner.identity

    def load(self) -> None:
        self.inner.load()

    def close(self) -> None:
        self.inner.close()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return self.inner.generate(request)


class TestSourceMix:
    def test_share_is_spread_evenly_while_live_requests_wait(self) -> None:
        """0.5 alternates; 0.25 is one in four; none waiting is always control."""
        mix = SourceMix()
        assert [mix.next_is_live(0.5, True) for _ in range(4)] == [False, True, False, True]
        quarter = SourceMix()
        assert sum(quarter.next_is_live(0.25, True) for _ in range(8)) == 2
        assert not any(SourceMix().next_is_live(1.0, False) for _ in range(5))

    def test_a_quiet_spell_earns_no_burst(self) -> None:
        """Pairs that found no live request do not make the next ones all live."""
        mix = SourceMix()
        for _ in range(10):
            mix.next_is_live(0.5, False)
        assert [mix.next_is_live(0.5, True) for _ in range(4)] == [False, True, False, True]


class TestLivePair:
    def test_every_arm_gets_the_requests_own_sampling(self) -> None:
        """The runner sends the live request's temperature, top_p, max_tokens and stop
        to both arms, and records the pair as live with that temperature."""
        baseline = Recording(FakeEngine(FakeEngineConfig(seed=1)))
        speculative = Recording(FakeEngine(FakeEngineConfig(speculative=True, seed=1)))
        runner = PairRunner(baseline, speculative, run_id="r")  # type: ignore[arg-type]
        live = request()
        group = runner.run_group(live_prompt(live), sampling=own_sampling(live), source="live")
        for engine in (baseline, speculative):
            (sent,) = engine.requests
            assert (sent.sampling.temperature, sent.sampling.top_p) == (0.7, 0.9)
            assert (sent.sampling.max_tokens, sent.sampling.stop) == (24, ("\n\n",))
        (record,) = group.records
        assert (record.source, record.temperature) == ("live", 0.7)
        assert record.prompt.id == live.prompt_hash
        assert record.prompt.category == "support"

    def test_stored_record_drops_text_unless_store_text(self) -> None:
        """A live record loses its messages, outputs, token ids and error details; with
        store_text, or for a control record, nothing changes."""
        runner = PairRunner(
            FakeEngine(FakeEngineConfig(seed=1)),
            FakeEngine(FakeEngineConfig(speculative=True, seed=1)),
            run_id="r",
        )
        live = request()
        (record,) = runner.run_group(
            live_prompt(live), sampling=own_sampling(live), source="live"
        ).records
        stored = stored_record(record, store_text=False)
        assert stored.prompt.messages == ()
        assert (stored.baseline.text, stored.speculative.token_ids) == ("", ())
        assert stored.scores == record.scores
        assert stored.speculative.output_tokens == record.speculative.output_tokens
        assert stored_record(record, store_text=True) is record


class TestTrafficMix:
    def test_ngram_repetition(self) -> None:
        """Repeated word 3-grams count; a prompt without repeats is 0."""
        assert ngram_repetition("a b c d e f") == 0.0
        assert ngram_repetition("a b c a b c") == 0.25
        assert ngram_repetition("short") == 0.0

    def test_window_mix(self) -> None:
        """Shares are of the requests seen; length and repetition of those sampled."""
        mix = window_mix({"code": 3, "chat": 1}, [request("a b c a b c"), request("xy")])
        assert mix.shares == {"chat": 0.25, "code": 0.75}
        assert mix.prompt_chars == (11 + 2) / 2
        assert mix.repetition == 0.125
        assert window_mix({}, []).prompt_chars is None


class TestTrafficMetrics:
    def test_a_closed_window_sets_the_mix_gauges(self) -> None:
        """The sampler hands each closed window's mix to the metrics: category shares
        (replaced each window), prompt length and repetition."""
        metrics = CanarydMetrics()
        sampler = LiveSampler(
            SamplingBounds(6, 2, 10, 0.0, 1000, 8),
            seed=0,
            observe=metrics.traffic.request,
            on_window=lambda mix: metrics.traffic.mix(mix.shares, mix.prompt_chars, mix.repetition),
        )
        for i in range(3):
            sampler.offer(request(f"a b c a b c {i}", category="code"))
        sampler.offer(request("plain words here", category="chat"))
        sampler.flush()

        def value(name: str, **labels: str) -> float | None:
            return metrics.registry.get_sample_value(name, labels)

        assert value("canaryd_traffic_category_share", category="code") == 0.75
        assert value("canaryd_traffic_category_share", category="chat") == 0.25
        assert value("canaryd_traffic_prompt_chars") is not None
        assert value("canaryd_traffic_ngram_repetition") is not None
        assert value("canaryd_traffic_requests_total", outcome="sampled") == 3.0
        assert value("canaryd_traffic_requests_total", outcome="rate_limited") == 1.0
        sampler.offer(request("only chat now", category="chat"))
        sampler.flush()
        assert value("canaryd_traffic_category_share", category="code") is None
        assert value("canaryd_traffic_category_share", category="chat") == 1.0
