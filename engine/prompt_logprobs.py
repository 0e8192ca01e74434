"""Teacher scores from a vLLM server's prompt log-probs: the requests and their reading.

A remote baseline arm can judge an output only through its server. vLLM scores a prompt
it is given: `/v1/completions` with `prompt_logprobs = 1` answers, per prompt position,
the log-prob and vocabulary rank of the token there (rank 1: the model's most likely
token) and the top token's log-prob. Sent the token ids of prompt + output, the output's
positions give exactly what the in-process teacher computes: mean NLL, the share of
argmax tokens and the mean top-token probability. The ids come from the server's own
`/tokenize`, so the prompt is the one the arm was sent (chat template applied for
`api = "chat"`); an output without token ids (streamed results carry none) is tokenised
from its text, which may split a word differently than the sampler did — both arms of a
pair get the same treatment.

Anything that does not read as that answer is a `PromptLogprobsError`: the check is
then not reported for the pair, never zero.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import PromptLogprobsError
from engine.types import Message, TeacherScore

__all__ = ["score_body", "teacher_score", "tokenize_body", "tokenized"]


def tokenize_body(
    model: str, api: str, messages: tuple[Message, ...] | None, text: str | None = None
) -> dict[str, Any]:
    """The `/tokenize` body for the prompt of `messages` as the arm sends it (`api`), or,
    with `text`, for an output's text alone."""
    if text is not None:
        return {"model": model, "prompt": text, "add_special_tokens": False}
    assert messages is not None
    if api == "chat":
        return {
            "model": model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "add_generation_prompt": True,
        }
    # The same raw text the completions API is sent (engine.http), special tokens as the
    # completions endpoint adds them by default.
    return {"model": model, "prompt": "\n\n".join(m.content for m in messages)}


def tokenized(answer: Any) -> list[int]:
    """The token ids of a `/tokenize` answer."""
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise PromptLogprobsError("/tokenize answer without a list of token ids")
    return tokens


def score_body(model: str, token_ids: list[int]) -> dict[str, Any]:
    """The `/v1/completions` body that has the server score `token_ids` as a prompt
    (one greedy token is generated: some versions refuse `max_tokens = 0`)."""
    return {
        "model": model,
        "prompt": token_ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
        "stream": False,
    }


def teacher_score(answer: Any, offset: int, output_ids: list[int]) -> TeacherScore:
    """The teacher score of `output_ids`, which sit at positions `offset`… of the prompt
    whose `prompt_logprobs` `answer` carries."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PromptLogprobsError("no choices")
    positions = choices[0].get("prompt_logprobs")
    if not isinstance(positions, list):
        raise PromptLogprobsError("no prompt_logprobs (a server without vLLM's extension)")
    if len(positions) != offset + len(output_ids):
        raise PromptLogprobsError(
            f"{len(positions)} prompt positions for {offset} prompt + {len(output_ids)} "
            "output tokens"
        )
    nll = top = worst = 0.0
    argmax = 0
    gaps: list[float] = []
    for token, entries in zip(output_ids, positions[offset:], strict=True):
        if not isinstance(entries, dict):
            raise PromptLogprobsError(f"position of token {token} is not an object")
        own = entries.get(str(token))
        if not isinstance(own, dict):
            raise PromptLogprobsError(f"token {token} missing from its position")
        logprob, rank = own.get("logprob"), own.get("rank")
        if not isinstance(logprob, int | float) or not math.isfinite(logprob):
            raise PromptLogprobsError(f"token {token}: logprob {logprob!r}")
        if not isinstance(rank, int):
            raise PromptLogprobsError(f"token {token}: rank {rank!r}")
        tops = [
            float(value)
            for entry in entries.values()
            if isinstance(entry, dict) and isinstance(value := entry.get("logprob"), int | float)
        ]
        if len(tops) != len(entries):
            raise PromptLogprobsError(f"token {token}: an entry without a logprob")
        nll -= logprob
        worst = max(worst, -logprob)
        argmax += rank == 1
        top += math.exp(max(tops))  # the rank-1 entry is among them
        gaps.append(max(max(tops) - float(logprob), 0.0))
    return TeacherScore(
        tokens=len(output_ids),
        mean_nll=nll / len(output_ids),
        argmax_share=argmax / len(output_ids),
        mean_top_probability=top / len(output_ids),
        max_nll=worst,
        gaps=tuple(gaps),
    )
