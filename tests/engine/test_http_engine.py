"""engine.http.OpenAIEngine against a real misbehaving OpenAI-compatible server on
loopback (tests.support.servers): healthy streams, every fault, retries, acceptance by
server kind, config validation and cancellation on close."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from engine.config import EngineConfig, OpenAIEngineConfig
from engine.http import OpenAIEngine
from engine.registry import build_engine
from engine.sse import output_byte_cap, over_output_cap
from engine.types import AcceptanceSource, ErrorKind, GenerationRequest, Message, SamplingParams
from tests.support.servers import Behaviour, MisbehavingServer, refused_url

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "servers"
REQUEST = GenerationRequest(
    messages=(Message("user", "Say hello."),),
    sampling=SamplingParams(max_tokens=16),
    request_id="r1",
)


@pytest.fixture
def server() -> Iterator[MisbehavingServer]:
    with MisbehavingServer() as running:
        yield running


def _engine(base_url: str, **overrides: Any) -> Iterator[OpenAIEngine]:
    settings: dict[str, Any] = {
        "base_url": base_url,
        "timeouts": {"connect": 1.0, "read": 1.0, "total": 5.0},
        "max_retries": 0,
    }
    settings.update(overrides)
    engine = OpenAIEngine(OpenAIEngineConfig(**settings))
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def engine(server: MisbehavingServer) -> Iterator[OpenAIEngine]:
    yield from _engine(server.url)


class TestConfig:
    def test_kind_openai_selects_the_http_engine(self) -> None:
        """`kind = "openai"` in an arm's table builds an OpenAIEngine through the registry."""
        config = TypeAdapter(EngineConfig).validate_python(
            {"kind": "openai", "base_url": "http://127.0.0.1:1"}
        )
        assert isinstance(config, OpenAIEngineConfig)
        assert isinstance(build_engine(config), OpenAIEngine)

    def test_one_key_source_only(self) -> None:
        """api_key, api_key_env and api_key_file exclude one another."""
        with pytest.raises(ValidationError, match="at most one of api_key"):
            OpenAIEngineConfig(base_url="http://x", api_key="a", api_key_env="B")

    def test_base_url_scheme(self) -> None:
        """A base_url without http(s):// fails at start with the offending value."""
        with pytest.raises(ValidationError, match="'localhost:8000'"):
            OpenAIEngineConfig(base_url="localhost:8000")

    def test_api_key_is_secret(self) -> None:
        """The key never appears in the config's repr."""
        config = OpenAIEngineConfig(base_url="http://x", api_key="sk-very-secret")
        assert "sk-very-secret" not in repr(config)


class TestHealthyStream:
    def test_chat_stream(self, server: MisbehavingServer, engine: OpenAIEngine) -> None:
        """Text, usage, finish reason and timings come from the stream; TTFT ≤ e2e."""
        server.queue(Behaviour(tokens=8, token_delay_s=0.01))
        result = engine.generate(REQUEST)
        assert result.ok, result.error_detail
        assert result.text == "".join(f" tok{i}" for i in range(8))
        assert (result.output_tokens, result.prompt_tokens) == (8, 5)
        assert result.finish_reason == "stop"
        assert result.ttft_s is not None and 0 < result.ttft_s < result.e2e_s
        assert result.tpot_s is not None and result.tpot_s > 0
        assert result.acceptance_source is AcceptanceSource.NOT_REPORTED
        assert result.speculative is None

    def test_itl_counts_one_token_a_chunk_without_usage(
        self, server: MisbehavingServer, engine: OpenAIEngine
    ) -> None:
        """A server that does not say how many tokens a chunk carried: each content chunk
        is one token, so eight chunks give seven gaps, each as long as the server's delay
        at least (and no longer than the whole generation)."""
        server.queue(Behaviour(tokens=8, token_delay_s=0.01))
        result = engine.generate(REQUEST)
        assert result.itl is not None
        assert (result.itl.tokens, result.itl.chunks) == (7, 7)
        assert 0.009 <= result.itl.p50_s <= result.itl.p99_s <= result.itl.max_s < result.e2e_s

    def test_vllm_chunks_say_how_many_tokens_they_carried(self, server: MisbehavingServer) -> None:
        """A vLLM arm asks for usage on every chunk; a chunk of three tokens gives one gap
        and two zeros, so the median gap is zero and the tail keeps the chunk's gap."""
        server.queue(Behaviour(tokens=6, token_delay_s=0.01, chunk_tokens=3))
        for engine in _engine(server.url, server_kind="vllm"):
            result = engine.generate(REQUEST)
        body = server.requests[-1]
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert result.output_tokens == 18
        assert result.itl is not None
        assert (result.itl.tokens, result.itl.chunks) == (17, 5)
        assert result.itl.p50_s == 0.0
        assert result.itl.max_s >= 0.009
        assert [n for _, n in result.itl.arrivals] == [3] * 6

    def test_request_body(self, server: MisbehavingServer, engine: OpenAIEngine) -> None:
        """The body asks for a stream with usage and carries the pair's sampling."""
        engine.generate(REQUEST)
        body = server.requests[-1]
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["messages"] == [{"role": "user", "content": "Say hello."}]
        assert (body["max_tokens"], body["temperature"], body["seed"]) == (16, 0.0, 0)

    def test_llamacpp_greedy_requests_turn_the_repeat_penalty_off(
        self, server: MisbehavingServer
    ) -> None:
        """llama-cpp-python's server penalises repeats (1.1) unless told: a greedy request
        to a llama.cpp arm says repeat_penalty 1.0, so the token it returns is the argmax of
        the log-probs it lists; a sampled one leaves the server's default; extra_body wins."""
        sampled = GenerationRequest(
            REQUEST.messages, SamplingParams(max_tokens=16, temperature=0.7)
        )
        for engine in _engine(server.url, server_kind="llamacpp"):
            engine.generate(REQUEST)
            assert server.requests[-1]["repeat_penalty"] == 1.0
            engine.generate(sampled)
            assert "repeat_penalty" not in server.requests[-1]
        for engine in _engine(
            server.url, server_kind="llamacpp", extra_body={"repeat_penalty": 1.3}
        ):
            engine.generate(REQUEST)
            assert server.requests[-1]["repeat_penalty"] == 1.3
        for engine in _engine(server.url, server_kind="vllm"):
            engine.generate(REQUEST)
            assert "repeat_penalty" not in server.requests[-1]

    def test_completions_api(self, server: MisbehavingServer) -> None:
        """api = "completions" posts a prompt and reads `text` deltas."""
        for engine in _engine(server.url, api="completions", extra_body={"top_k": 1}):
            result = engine.generate(REQUEST)
            assert result.ok and result.text.startswith(" tok0")
            assert server.requests[-1]["prompt"] == "Say hello."
            assert server.requests[-1]["top_k"] == 1

    def test_api_key_from_file(self, server: MisbehavingServer, tmp_path: Path) -> None:
        """A key read from api_key_file is sent as a bearer token (and works)."""
        key_file = tmp_path / "key"
        key_file.write_text("sk-test\n")
        for engine in _engine(server.url, api_key_file=key_file):
            assert engine.generate(REQUEST).ok

    def test_missing_key_env_is_a_result(self, server: MisbehavingServer) -> None:
        """An unset api_key_env fails the generation with a message naming the variable."""
        for engine in _engine(server.url, api_key_env="CANARYD_TEST_UNSET_KEY"):
            result = engine.generate(REQUEST)
            assert not result.ok and "CANARYD_TEST_UNSET_KEY" in result.error_detail


class TestFaults:
    def test_refused_connection(self) -> None:
        """Nothing listening: a `connection` error, not an exception."""
        for engine in _engine(refused_url()):
            result = engine.generate(REQUEST)
            assert result.error is ErrorKind.CONNECTION
            assert "ConnectError" in result.error_detail

    @pytest.mark.parametrize("status", [429, 500, 502, 503])
    def test_http_status(
        self, server: MisbehavingServer, engine: OpenAIEngine, status: int
    ) -> None:
        """A 429/5xx answer is an `http` error carrying the status and the server's text."""
        server.queue(Behaviour(fault="status", status=status))
        result = engine.generate(REQUEST)
        assert (result.error, result.http_status) == (ErrorKind.HTTP, status)
        assert "injected" in result.error_detail

    def test_stall_before_headers(self, server: MisbehavingServer, engine: OpenAIEngine) -> None:
        """A server that accepts and goes silent trips the read timeout: `timeout`."""
        server.queue(Behaviour(fault="stall_headers", stall_s=3.0))
        result = engine.generate(REQUEST)
        assert result.error is ErrorKind.TIMEOUT
        assert result.e2e_s < 2.5

    def test_stall_mid_stream(self, server: MisbehavingServer, engine: OpenAIEngine) -> None:
        """A stream that stops between chunks trips the read timeout: `timeout`."""
        server.queue(Behaviour(fault="stall_stream", stall_s=3.0))
        assert engine.generate(REQUEST).error is ErrorKind.TIMEOUT

    def test_total_timeout(self, server: MisbehavingServer) -> None:
        """A slow but live stream is cut at the request's own timeout_s: `timeout`."""
        server.queue(Behaviour(tokens=50, token_delay_s=0.05))
        request = GenerationRequest(messages=REQUEST.messages, timeout_s=0.5)
        for engine in _engine(server.url):
            result = engine.generate(request)
            assert result.error is ErrorKind.TIMEOUT
            assert 0.4 < result.e2e_s < 1.5

    def test_cut_stream(self, server: MisbehavingServer, engine: OpenAIEngine) -> None:
        """A connection dropped mid-stream is a `connection` error, not a short answer."""
        server.queue(Behaviour(fault="cut", tokens=3))
        result = engine.generate(REQUEST)
        assert result.error is ErrorKind.CONNECTION
        assert result.text == ""

    def test_malformed_chunk(self, server: MisbehavingServer, engine: OpenAIEngine) -> None:
        """A chunk that is not JSON is `invalid`, quoting the chunk."""
        server.queue(Behaviour(fault="malformed"))
        result = engine.generate(REQUEST)
        assert result.error is ErrorKind.INVALID
        assert "malformed chunk" in result.error_detail

    def test_not_a_stream(self, server: MisbehavingServer, engine: OpenAIEngine) -> None:
        """A server that ignores stream=true and answers JSON is `invalid`."""
        server.queue(Behaviour(fault="json"))
        result = engine.generate(REQUEST)
        assert result.error is ErrorKind.INVALID
        assert "application/json" in result.error_detail

    def test_engine_keeps_working_after_faults(
        self, server: MisbehavingServer, engine: OpenAIEngine
    ) -> None:
        """After every kind of fault the same engine still serves a healthy request."""
        server.queue(
            Behaviour(fault="status", status=500),
            Behaviour(fault="cut"),
            Behaviour(fault="malformed"),
            Behaviour(fault="stall_stream", stall_s=2.0),
        )
        errors = [engine.generate(REQUEST).error for _ in range(4)]
        assert errors == [
            ErrorKind.HTTP,
            ErrorKind.CONNECTION,
            ErrorKind.INVALID,
            ErrorKind.TIMEOUT,
        ]
        assert engine.generate(REQUEST).ok


class TestHostileStreams:
    @pytest.mark.parametrize("api", ["chat", "completions"])
    def test_an_endless_stream_ends_invalid_output_at_the_byte_cap(
        self, server: MisbehavingServer, api: str
    ) -> None:
        """A server streaming well-formed content for ever (~30 MB/s): the generation ends
        within a second as `invalid_output`, past `output_byte_cap(max_tokens)` by at
        most one read, and the stream is closed; the next request is served."""
        server.queue(Behaviour(fault="endless", chunk_bytes=64 * 1024, token_delay_s=0.002))
        cap = output_byte_cap(REQUEST.sampling.max_tokens)
        timeouts = {"read": 5, "total": 30}
        for engine in _engine(server.url, api=api, timeouts=timeouts, top_logprobs=0):
            started = time.perf_counter()
            result = engine.generate(REQUEST)
            assert time.perf_counter() - started < 1.0
            assert result.error is ErrorKind.INVALID_OUTPUT, result.error_detail
            assert over_output_cap(result) and result.text == ""
            streamed = int(result.error_detail.split(": ")[1].split(" bytes")[0])
            assert cap < streamed <= cap + 2 * 64 * 1024 + 4096, result.error_detail
            assert f"the cap is {cap} " in result.error_detail
            assert engine.generate(REQUEST).ok

    def test_a_dripping_stream_ends_at_the_whole_generation_deadline(
        self, server: MisbehavingServer
    ) -> None:
        """One byte every 50 ms never trips the read timeout: the request's own deadline
        bounds the whole stream, not each read (`timeout` at 1 s)."""
        server.queue(Behaviour(fault="drip", drip_s=0.05))
        request = GenerationRequest(messages=REQUEST.messages, timeout_s=1.0)
        for engine in _engine(server.url):
            result = engine.generate(request)
            assert result.error is ErrorKind.TIMEOUT
            # Not the arm's own total (5 s): the upper bound sits between the two, with
            # room for a loaded CI machine to wake the timer late.
            assert 0.9 < result.e2e_s < 3.0


class TestRetries:
    def test_429_then_ok(self, server: MisbehavingServer) -> None:
        """429 and 503 before any token are retried (Retry-After honoured) and succeed."""
        server.queue(
            Behaviour(fault="status", status=429, retry_after="0"),
            Behaviour(fault="status", status=503, retry_after="0"),
        )
        for engine in _engine(server.url, max_retries=2):
            assert engine.generate(REQUEST).ok
        assert len(server.requests) == 3

    def test_500_is_not_retried(self, server: MisbehavingServer) -> None:
        """A 500 may have run the request: it is reported, never retried."""
        server.queue(Behaviour(fault="status", status=500))
        for engine in _engine(server.url, max_retries=3):
            assert engine.generate(REQUEST).http_status == 500
        assert len(server.requests) == 1

    def test_cut_stream_is_not_retried(self, server: MisbehavingServer) -> None:
        """Once tokens streamed, a failure is final."""
        server.queue(Behaviour(fault="cut"))
        for engine in _engine(server.url, max_retries=3):
            assert engine.generate(REQUEST).error is ErrorKind.CONNECTION
        assert len(server.requests) == 1

    def test_refused_retries_then_fails(self) -> None:
        """Refused connections are retried max_retries times, then reported."""
        for engine in _engine(refused_url(), max_retries=2):
            started = time.perf_counter()
            assert engine.generate(REQUEST).error is ErrorKind.CONNECTION
            assert time.perf_counter() - started >= 0.2 + 0.4  # two backoffs


class TestAcceptance:
    def test_llamacpp_timings(self, server: MisbehavingServer) -> None:
        """A llama.cpp speculative arm reads draft_n/draft_n_accepted: exact per request."""
        timings = {"predicted_n": 8, "draft_n": 9, "draft_n_accepted": 5}
        server.queue(Behaviour(tokens=8, final_extra={"timings": timings}))
        for engine in _engine(server.url, speculative=True, server_kind="llamacpp"):
            result = engine.generate(REQUEST)
            assert result.acceptance_source is AcceptanceSource.PER_REQUEST
            assert result.speculative is not None
            assert (result.speculative.verify_steps, result.speculative.accepted_tokens) == (3, 5)

    def test_vllm_window(self, server: MisbehavingServer) -> None:
        """A vLLM arm differences /metrics around the request: a window aggregate."""
        texts = iter(
            [(FIXTURES / f"vllm_metrics_{name}.txt").read_text() for name in ("before", "after")]
        )
        server.metrics_text = next(texts)
        original = server.next_behaviour

        def advance() -> Behaviour:  # the counters move while the request runs
            server.metrics_text = next(texts)
            return original()

        server.next_behaviour = advance  # type: ignore[method-assign]
        for engine in _engine(
            server.url, speculative=True, server_kind="vllm", metrics_url=f"{server.url}/metrics"
        ):
            result = engine.generate(REQUEST)
            assert result.ok
            assert result.acceptance_source is AcceptanceSource.WINDOW_AGGREGATE
            assert result.speculative is not None and result.speculative.verify_steps == 100

    def test_sglang_server_info(self, server: MisbehavingServer) -> None:
        """An SGLang arm without meta_info uses /server_info's average: a window figure."""
        server.server_info = {"internal_states": [{"avg_spec_accept_length": 2.0}]}
        for engine in _engine(
            server.url,
            speculative=True,
            server_kind="sglang",
            metrics_url=f"{server.url}/server_info",
        ):
            result = engine.generate(REQUEST)
            assert result.acceptance_source is AcceptanceSource.WINDOW_AGGREGATE
            assert result.speculative is not None and result.speculative.verify_steps == 4

    def test_unreadable_metrics_is_not_reported(self, server: MisbehavingServer) -> None:
        """A metrics_url that fails leaves acceptance not reported; the answer stands."""
        for engine in _engine(
            server.url, speculative=True, server_kind="vllm", metrics_url=f"{server.url}/nope"
        ):
            result = engine.generate(REQUEST)
            assert result.ok and result.acceptance_source is AcceptanceSource.NOT_REPORTED
            assert result.speculative is None

    def test_generic_is_not_reported(self, server: MisbehavingServer) -> None:
        """A generic server's speculative arm reports no acceptance — never zeros."""
        for engine in _engine(server.url, speculative=True):
            result = engine.generate(REQUEST)
            assert result.ok and result.speculative is None
            assert result.acceptance_source is AcceptanceSource.NOT_REPORTED


class TestConcurrencyAndClose:
    def test_concurrency_limit(self, server: MisbehavingServer) -> None:
        """No more than max_concurrency requests reach the server at once."""
        active = peak = 0
        lock = threading.Lock()
        original = server.next_behaviour

        def counting() -> Behaviour:
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
            time.sleep(0.1)
            with lock:
                active -= 1
            return original()

        server.next_behaviour = counting  # type: ignore[method-assign]
        for engine in _engine(server.url, max_concurrency=2):
            threads = [threading.Thread(target=engine.generate, args=(REQUEST,)) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert peak == 2

    def test_close_cancels_in_flight(self, server: MisbehavingServer) -> None:
        """close() during a stalled request returns it at once as a `connection` error."""
        server.queue(Behaviour(fault="stall_stream", stall_s=5.0))
        results = []
        for engine in _engine(server.url, timeouts={"read": 10.0, "total": 10.0}):
            thread = threading.Thread(
                target=lambda arm=engine: results.append(arm.generate(REQUEST))
            )
            thread.start()
            time.sleep(0.3)
            started = time.perf_counter()
            engine.close()
            thread.join(timeout=5)
            assert time.perf_counter() - started < 2.0
        assert results[0].error is ErrorKind.CONNECTION
        assert "closed" in results[0].error_detail

    def test_generate_after_close(self, server: MisbehavingServer) -> None:
        """A closed engine answers with a `connection` error, not an exception."""
        for engine in _engine(server.url):
            engine.close()
            assert engine.generate(REQUEST).error is ErrorKind.CONNECTION
