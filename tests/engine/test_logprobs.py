"""A remote baseline's top log-probs: the request fields, the two APIs' streamed shapes
read into `TokenLogprobs`, malformed log-probs dropped (never guessed), and on a real
loopback server: asked on a baseline's greedy requests only, asked again without them
when the server refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.config import OpenAIEngineConfig
from engine.http import OpenAIEngine
from engine.logprobs import read_chunk, request_fields
from engine.types import ErrorKind, GenerationRequest, Message, SamplingParams, TokenLogprobs
from tests.support.servers import Behaviour, MisbehavingServer

GREEDY = GenerationRequest((Message("user", "Say hello."),), SamplingParams(max_tokens=4))
SAMPLED = GenerationRequest(
    (Message("user", "Say hello."),), SamplingParams(max_tokens=4, temperature=0.7)
)


def chat_choice(*tokens: tuple[str, float, list[tuple[str, float]]]) -> dict[str, Any]:
    return {
        "index": 0,
        "delta": {"content": "".join(t for t, _, _ in tokens)},
        "logprobs": {
            "content": [
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": None,
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in top],
                }
                for token, logprob, top in tokens
            ]
        },
    }


class TestReading:
    def test_request_fields_per_api(self) -> None:
        assert request_fields("chat", 5) == {"logprobs": True, "top_logprobs": 5}
        assert request_fields("completions", 5) == {"logprobs": 5}

    def test_a_chat_chunk(self) -> None:
        into: list[TokenLogprobs] = []
        choice = chat_choice((" glad", -1.4, [(" glad", -1.4), (" here", -1.9)]))
        assert read_chunk(choice, True, into)
        assert into == [TokenLogprobs(" glad", -1.4, ((" glad", -1.4), (" here", -1.9)))]

    def test_a_completions_chunk_lists_candidates_best_first(self) -> None:
        into: list[TokenLogprobs] = []
        choice = {
            "text": " it",
            "logprobs": {
                "tokens": [" it"],
                "text_offset": [7],
                "token_logprobs": [-2.5],
                "top_logprobs": [{" the": -2.8, " it": -2.5, " but": -3.5}],
            },
        }
        assert read_chunk(choice, False, into)
        assert into == [TokenLogprobs(" it", -2.5, ((" it", -2.5), (" the", -2.8), (" but", -3.5)))]

    @pytest.mark.parametrize(
        "logprobs",
        [
            "nope",
            {"content": "nope"},
            {"content": [{"token": "a", "logprob": "x", "top_logprobs": []}]},
            {"content": [{"token": "a", "logprob": -1.0, "top_logprobs": [{"token": "b"}]}]},
            {"content": [{"token": "a", "logprob": float("nan"), "top_logprobs": []}]},
        ],
    )
    def test_malformed_chat_log_probs_read_as_broken(self, logprobs: Any) -> None:
        into: list[TokenLogprobs] = []
        assert not read_chunk({"logprobs": logprobs}, True, into)
        assert into == []

    def test_a_completions_chunk_with_uneven_lists_is_broken(self) -> None:
        logprobs = {"tokens": ["a", "b"], "token_logprobs": [-1.0], "top_logprobs": [{}, {}]}
        assert not read_chunk({"logprobs": logprobs}, False, [])

    def test_no_log_probs_is_fine(self) -> None:
        assert read_chunk({"delta": {"content": "x"}, "logprobs": None}, True, [])
        assert read_chunk({"delta": {"content": "x"}}, True, [])


@pytest.fixture
def server() -> Iterator[MisbehavingServer]:
    with MisbehavingServer() as running:
        yield running


def engine(url: str, **overrides: Any) -> OpenAIEngine:
    settings: dict[str, Any] = {"base_url": url, "max_retries": 0} | overrides
    return OpenAIEngine(OpenAIEngineConfig(**settings))


class TestAsking:
    def test_only_a_baselines_greedy_requests_ask(self, server: MisbehavingServer) -> None:
        """A baseline's greedy request asks for 5 candidates (chat: logprobs + top_logprobs;
        completions: logprobs = N); its sampled requests and a speculative arm never ask."""
        asked = []
        for overrides, request in [
            ({}, GREEDY),
            ({"api": "completions"}, GREEDY),
            ({}, SAMPLED),
            ({"speculative": True}, GREEDY),
            ({"top_logprobs": 0}, GREEDY),
        ]:
            arm = engine(server.url, **overrides)
            try:
                assert arm.generate(request).ok
            finally:
                arm.close()
            body = server.requests[-1]
            asked.append((body.get("logprobs"), body.get("top_logprobs")))
        assert asked == [(True, 5), (5, None), (None, None), (None, None), (None, None)]

    def test_a_server_that_refuses_them_is_asked_again_without(
        self, server: MisbehavingServer
    ) -> None:
        """400 to a log-probs request: the same request again without them (the generation
        succeeds), and later requests never ask."""
        server.queue(Behaviour(fault="status", status=400))
        arm = engine(server.url)
        try:
            first = arm.generate(GREEDY)
            second = arm.generate(GREEDY)
        finally:
            arm.close()
        assert first.error is ErrorKind.NONE and second.ok, first.error_detail
        assert [body.get("logprobs") for body in server.requests] == [True, None, None]
        assert first.token_logprobs == ()
