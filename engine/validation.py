"""What an engine's answer must satisfy before canaryd believes it.

A server can send text that no one can store or read (lone surrogates, undecodable bytes)
or counts that cannot be true (negative, beyond the request's `max_tokens`, beyond any
machine integer). Such an answer is a failure of the arm that sent it, with its own error
kind (`invalid_output`), not something to score, export or store as a success: a garbage
arm must count against itself in the error and liveness gates instead of blinding them.
"""

from __future__ import annotations

import dataclasses
import math

from engine.types import ErrorKind, GenerationRequest, GenerationResult

__all__ = ["MAX_COUNT", "OUTPUT_TOKENS_SLACK", "checked_result", "output_problem"]

# No count a real server reports for one request comes near a signed 32-bit integer.
MAX_COUNT = 2**31 - 1
# Servers may count a token or two beyond `max_tokens` (a stop token, a bonus token of the
# last verify step); more than this is not slack but a wrong count.
OUTPUT_TOKENS_SLACK = 8


def _text_problem(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"text is not valid Unicode: {exc.reason} at character {exc.start} "
            f"({text[exc.start : exc.end]!a})"
        )
    return None


def _count_problem(name: str, value: int | None, limit: int = MAX_COUNT) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} is not an integer ({value!r})"
    if value < 0:
        return f"{name} is negative ({value})"
    if value > limit:
        return f"{name} is {value}, above {limit}"
    return None


def _timing_problem(name: str, value: float | None) -> str | None:
    if value is None:
        return None
    if not math.isfinite(value) or value < 0:
        return f"{name} is {value!r}, not a finite non-negative duration"
    return None


def output_problem(result: GenerationResult, request: GenerationRequest) -> str | None:
    """Why `result` cannot be a true answer to `request`; None when it can.

    Failures are not checked (they carry no output): only what a succeeded answer claims."""
    if not result.ok:
        return None
    output_limit = request.sampling.max_tokens + OUTPUT_TOKENS_SLACK
    problems = [
        _text_problem(result.text),
        _text_problem(result.finish_reason),
        _count_problem("completion tokens", result.output_tokens, output_limit),
        _count_problem("prompt tokens", result.prompt_tokens),
        _count_problem("token ids", len(result.token_ids), output_limit),
        _count_problem(
            "a token id", next((t for t in result.token_ids if not 0 <= t <= MAX_COUNT), None)
        ),
        _timing_problem("ttft_s", result.ttft_s),
        _timing_problem("tpot_s", result.tpot_s),
        _timing_problem("e2e_s", result.e2e_s),
    ]
    stats = result.speculative
    if stats is not None:
        problems += [
            _count_problem("verify steps", stats.verify_steps),
            _count_problem("draft tokens", stats.draft_tokens),
            _count_problem("accepted tokens", stats.accepted_tokens),
            *(_count_problem("accepted at a position", n) for n in stats.accepted_per_position),
            *(_count_problem("drafted at a position", n) for n in stats.drafted_per_position),
        ]
        if (
            stats.draft_tokens is not None
            and isinstance(stats.accepted_tokens, int)
            and isinstance(stats.draft_tokens, int)
            and stats.accepted_tokens > stats.draft_tokens
        ):
            problems.append(
                f"accepted tokens ({stats.accepted_tokens}) exceed drafted tokens "
                f"({stats.draft_tokens})"
            )
    return next((problem for problem in problems if problem is not None), None)


def checked_result(result: GenerationResult, request: GenerationRequest) -> GenerationResult:
    """`result`, or an `invalid_output` failure of the arm in its place (timings kept
    when they are believable, the reason in `error_detail`)."""
    problem = output_problem(result, request)
    if problem is None:
        return result
    e2e = result.e2e_s if _timing_problem("e2e_s", result.e2e_s) is None else 0.0
    prompt_tokens = result.prompt_tokens if _count_problem("p", result.prompt_tokens) is None else 0
    failed = GenerationResult.failed(
        ErrorKind.INVALID_OUTPUT, problem, e2e, prompt_tokens=prompt_tokens
    )
    return dataclasses.replace(failed, http_status=result.http_status)
