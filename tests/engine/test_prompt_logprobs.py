"""Teacher scores of a remote arm: OpenAIEngine.score against the loopback server's
vLLM-style `/tokenize` and `prompt_logprobs` (tests.support.servers), and the reading of
those answers (engine.prompt_logprobs)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import pytest

from engine.config import OpenAIEngineConfig
from engine.errors import PromptLogprobsError
from engine.http import OpenAIEngine
from engine.prompt_logprobs import teacher_score
from engine.types import ErrorKind, GenerationRequest, GenerationResult, Message, SamplingParams
from tests.support.servers import Behaviour, MisbehavingServer, teacher_logprob, word_id

MESSAGES = (Message("system", "Be brief."), Message("user", "Say hello."))


def output(text: str, token_ids: tuple[int, ...] = ()) -> GenerationResult:
    return GenerationResult(
        text=text,
        token_ids=token_ids,
        finish_reason="stop",
        prompt_tokens=5,
        output_tokens=len(token_ids) or len(text.split()),
        ttft_s=0.01,
        tpot_s=0.01,
        e2e_s=0.1,
    )


def expected(ids: list[int]) -> tuple[float, float, float]:
    """(mean NLL, argmax share, mean top probability) the loopback teacher gives `ids`."""
    pairs = [teacher_logprob(t) for t in ids]
    tops = [math.exp(lp if rank == 1 else -0.1) for lp, rank in pairs]
    n = len(ids)
    return -sum(lp for lp, _ in pairs) / n, sum(r == 1 for _, r in pairs) / n, sum(tops) / n


@pytest.fixture
def server() -> Iterator[MisbehavingServer]:
    with MisbehavingServer() as running:
        yield running


def make(server: MisbehavingServer, **overrides: Any) -> Iterator[OpenAIEngine]:
    settings: dict[str, Any] = {
        "base_url": server.url,
        "server_kind": "vllm",
        "model": "m",
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
def vllm(server: MisbehavingServer) -> Iterator[OpenAIEngine]:
    yield from make(server)


class TestRemoteTeacher:
    def test_output_ids_are_scored_after_the_chat_prompt(
        self, server: MisbehavingServer, vllm: OpenAIEngine
    ) -> None:
        """The prompt is the server's own chat-templated tokenisation; the output's ids
        follow it; only the output's positions count."""
        ids = (12, 13, 14, 20)
        score = vllm.score(MESSAGES, output("a b c d", ids))
        nll, share, top = expected(list(ids))
        assert score is not None and score.tokens == 4
        assert score.mean_nll == pytest.approx(nll) and score.argmax_share == pytest.approx(share)
        assert score.mean_top_probability == pytest.approx(top)
        tokenize, scored = server.requests
        assert tokenize["messages"][1] == {"role": "user", "content": "Say hello."}
        assert tokenize["add_generation_prompt"] is True
        system, user = [word_id("Be"), word_id("brief.")], [word_id("Say"), word_id("hello.")]
        prompt = [1, *system, 2, 1, *user, 2, 3]
        assert scored["prompt"] == [*prompt, *ids]
        assert (scored["prompt_logprobs"], scored["stream"], scored["model"]) == (1, False, "m")

    def test_text_without_ids_is_tokenised_by_the_server(
        self, server: MisbehavingServer, vllm: OpenAIEngine
    ) -> None:
        """Streamed results carry no ids: the output's text is tokenised without special
        tokens and scored."""
        score = vllm.score(MESSAGES, output("hello there friend"))
        words = [word_id(w) for w in ("hello", "there", "friend")]
        assert score is not None and score.tokens == 3
        assert score.mean_nll == pytest.approx(expected(words)[0])
        assert server.requests[1] == {
            "model": "m",
            "prompt": "hello there friend",
            "add_special_tokens": False,
        }

    def test_the_prompt_is_tokenised_once_per_pair(
        self, server: MisbehavingServer, vllm: OpenAIEngine
    ) -> None:
        """Both arms of a pair share a prompt: its tokenisation is reused."""
        vllm.score(MESSAGES, output("x", (12,)))
        vllm.score(MESSAGES, output("y", (14,)))
        assert sum(1 for body in server.requests if "messages" in body) == 1

    def test_completions_api_scores_the_raw_prompt(self, server: MisbehavingServer) -> None:
        """api = "completions" sends raw text: the prompt is tokenised as that text."""
        for engine in make(server, api="completions"):
            assert engine.score(MESSAGES, output("x", (12,))) is not None
            assert server.requests[0]["prompt"] == "Be brief.\n\nSay hello."
            assert server.requests[1]["prompt"][0] == 0  # the special token it adds

    def test_other_servers_are_not_reported(self, server: MisbehavingServer) -> None:
        """Only vLLM has prompt log-probs: other kinds are None, nothing is sent."""
        for engine in make(server, server_kind="llamacpp"):
            assert engine.score(MESSAGES, output("x", (12,))) is None
        assert server.requests == []

    def test_a_server_without_the_extension_is_not_reported(
        self, server: MisbehavingServer, vllm: OpenAIEngine
    ) -> None:
        """An answer without prompt_logprobs is None, never zero."""
        server.prompt_logprobs = False
        assert vllm.score(MESSAGES, output("x", (12,))) is None

    def test_failures_are_not_reported_and_the_engine_goes_on(
        self, server: MisbehavingServer, vllm: OpenAIEngine
    ) -> None:
        """An HTTP error or a malformed answer scores None; generation still works."""
        server.queue(Behaviour(fault="status", status=500))
        assert vllm.score(MESSAGES, output("x", (12,))) is None
        server.queue(Behaviour(), Behaviour(fault="json"))
        assert vllm.score(MESSAGES, output("x", (12,))) is None
        request = GenerationRequest(MESSAGES, SamplingParams(max_tokens=4), request_id="r")
        assert vllm.generate(request).ok

    def test_an_empty_or_failed_output_is_not_reported(
        self, server: MisbehavingServer, vllm: OpenAIEngine
    ) -> None:
        failed = GenerationResult.failed(ErrorKind.TIMEOUT, "slow", 1.0)
        assert vllm.score(MESSAGES, failed) is None
        assert vllm.score(MESSAGES, output("")) is None
        assert server.requests == []

    def test_a_closed_engine_is_not_reported(self, server: MisbehavingServer) -> None:
        for engine in make(server):
            engine.close()
            assert engine.score(MESSAGES, output("x", (12,))) is None


def answer(positions: list[Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": "", "prompt_logprobs": positions}]}


class TestReading:
    def test_rank_one_is_argmax(self) -> None:
        """vLLM's rank of the token itself decides the argmax share; the top entry beside
        it gives the top-token probability."""
        positions = [
            None,
            {"7": {"logprob": -1.0, "rank": 1}},
            {"9": {"logprob": -3.0, "rank": 4}, "2": {"logprob": -0.2, "rank": 1}},
        ]
        score = teacher_score(answer(positions), 1, [7, 9])
        assert (score.tokens, score.mean_nll, score.argmax_share) == (2, 2.0, 0.5)
        assert score.mean_top_probability == pytest.approx((math.exp(-1.0) + math.exp(-0.2)) / 2)

    @pytest.mark.parametrize(
        ("positions", "message"),
        [
            ([None, {"7": {"logprob": -1.0, "rank": 1}}], "2 prompt positions for 1 prompt + 2"),
            ([None, {"8": {"logprob": -1.0, "rank": 1}}], "token 7 missing from its position"),
            ([None, {"7": {"logprob": None, "rank": 1}}], "token 7: logprob None"),
            ([None, {"7": {"logprob": -1.0}}], "token 7: rank None"),
        ],
    )
    def test_malformed_answers_name_what_is_wrong(self, positions: list[Any], message: str) -> None:
        ids = [7, 9] if "2 prompt positions" in message else [7]
        with pytest.raises(PromptLogprobsError, match=re.escape(message)):
            teacher_score(answer(positions), 1, ids)

    def test_a_plain_completion_is_not_a_score(self) -> None:
        with pytest.raises(PromptLogprobsError, match="no prompt_logprobs"):
            teacher_score({"choices": [{"index": 0, "text": "x"}]}, 1, [7])
