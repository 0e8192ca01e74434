"""What an engine's answer must satisfy: text that can be stored, counts that can be true."""

from __future__ import annotations

import dataclasses

import pytest

from engine.types import (
    ErrorKind,
    GenerationRequest,
    GenerationResult,
    Message,
    SamplingParams,
    SpeculativeStats,
)
from engine.validation import MAX_COUNT, OUTPUT_TOKENS_SLACK, checked_result, output_problem

REQUEST = GenerationRequest((Message("user", "hi"),), SamplingParams(max_tokens=16))
GOOD = GenerationResult(
    text="hello there",
    token_ids=(5, 6),
    finish_reason="stop",
    prompt_tokens=3,
    output_tokens=2,
    ttft_s=0.1,
    tpot_s=0.01,
    e2e_s=0.2,
    http_status=200,
    speculative=SpeculativeStats(
        verify_steps=1, draft_tokens=4, accepted_tokens=1, accepted_per_position=(1,)
    ),
)


class TestOutputProblem:
    def test_a_true_answer_passes_unchanged(self) -> None:
        """A well-formed answer has no problem and comes back as the same object."""
        assert output_problem(GOOD, REQUEST) is None
        assert checked_result(GOOD, REQUEST) is GOOD

    @pytest.mark.parametrize(
        ("change", "reason"),
        [
            ({"text": "x \udc80 y"}, "not valid Unicode"),
            ({"output_tokens": -3}, "completion tokens is negative"),
            ({"output_tokens": 16 + OUTPUT_TOKENS_SLACK + 1}, "completion tokens is"),
            ({"prompt_tokens": MAX_COUNT + 1}, "prompt tokens is"),
            ({"token_ids": (5, -1, 6)}, "a token id is negative"),
            ({"e2e_s": float("nan")}, "e2e_s is nan"),
            ({"ttft_s": -1.0}, "ttft_s is -1.0"),
        ],
    )
    def test_impossible_answers_are_failures_of_their_arm(
        self, change: dict[str, object], reason: str
    ) -> None:
        """Lone surrogates, negative or oversized counts and broken timings make the
        answer an `invalid_output` failure that names what was wrong."""
        bad = dataclasses.replace(GOOD, **change)
        problem = output_problem(bad, REQUEST)
        assert problem is not None and reason in problem
        checked = checked_result(bad, REQUEST)
        assert checked.error is ErrorKind.INVALID_OUTPUT
        assert checked.text == "" and checked.output_tokens == 0
        assert reason in checked.error_detail
        assert checked.e2e_s >= 0

    def test_the_servers_slack_is_allowed(self) -> None:
        """A count a few tokens over max_tokens (a stop or bonus token) is still believed."""
        slack = dataclasses.replace(GOOD, output_tokens=16 + OUTPUT_TOKENS_SLACK)
        assert output_problem(slack, REQUEST) is None

    def test_acceptance_counts_must_be_possible(self) -> None:
        """Negative acceptance counts, or more accepted than drafted, are invalid output."""
        negative = dataclasses.replace(
            GOOD, speculative=dataclasses.replace(GOOD.speculative, accepted_tokens=-2)
        )
        more = dataclasses.replace(
            GOOD, speculative=dataclasses.replace(GOOD.speculative, accepted_tokens=9)
        )
        assert "accepted tokens is negative" in (output_problem(negative, REQUEST) or "")
        assert "exceed drafted tokens" in (output_problem(more, REQUEST) or "")

    def test_failures_are_left_as_they_are(self) -> None:
        """A failure carries no output to judge: it is returned unchanged."""
        failed = GenerationResult.failed(ErrorKind.TIMEOUT, "slow", -5.0)
        assert checked_result(failed, REQUEST) is failed
