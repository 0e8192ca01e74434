"""A remote baseline's own top log-probs along its greedy output: the request and its reading.

Every OpenAI-compatible server canaryd speaks returns, per generated token, the token's
log-prob and the N likeliest candidates at its position when asked: `logprobs: true,
top_logprobs: N` on `/v1/chat/completions` (vLLM, SGLang, TGI's Messages API, llama.cpp
and llama-cpp-python) and `logprobs: N` on `/v1/completions` (vLLM, SGLang, llama.cpp).
Streamed, a chat chunk carries `choices[0].logprobs.content`, a list of
`{token, logprob, top_logprobs: [{token, logprob}]}`; a completions chunk carries
`choices[0].logprobs` with parallel lists `tokens`, `token_logprobs` and `top_logprobs`
(one `{token: logprob}` object per position). `read_chunk` reads either into
`TokenLogprobs`; a chunk whose log-probs do not read so marks the answer's log-probs
broken (the generation itself stands: its log-probs are dropped, never guessed).
The scoring side (canaryd.scoring.margins) judges a greedy divergence by them.
"""

from __future__ import annotations

import math
from typing import Any

from engine.types import TokenLogprobs

__all__ = ["BYTES_PER_CANDIDATE", "read_chunk", "request_fields"]

# Bytes a server may add per token and listed candidate (llama.cpp lists id, text, bytes
# and log-prob: about 80 bytes; a long token's bytes array up to 200).
BYTES_PER_CANDIDATE = 256


def request_fields(api: str, top: int) -> dict[str, Any]:
    """The request fields asking for `top` candidates per output token."""
    if api == "chat":
        return {"logprobs": True, "top_logprobs": top}
    return {"logprobs": top}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    # A candidate the server could not score (-inf, or a clamped -9999) is listed last.
    return number if not math.isnan(number) and number != math.inf else None


def _chat_entry(entry: Any) -> TokenLogprobs | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
        return None
    logprob = _number(entry.get("logprob"))
    listed = entry.get("top_logprobs")
    if logprob is None or not isinstance(listed, list):
        return None
    top: list[tuple[str, float]] = []
    for candidate in listed:
        if not isinstance(candidate, dict) or not isinstance(candidate.get("token"), str):
            return None
        value = _number(candidate.get("logprob"))
        if value is None:
            return None
        top.append((candidate["token"], value))
    return TokenLogprobs(entry["token"], logprob, tuple(top))


def _completion_entries(logprobs: dict[str, Any]) -> list[TokenLogprobs] | None:
    tokens, values, tops = (
        logprobs.get("tokens"),
        logprobs.get("token_logprobs"),
        logprobs.get("top_logprobs"),
    )
    if not (isinstance(tokens, list) and isinstance(values, list) and isinstance(tops, list)):
        return None
    if not len(tokens) == len(values) == len(tops):
        return None
    out: list[TokenLogprobs] = []
    for token, value, candidates in zip(tokens, values, tops, strict=True):
        logprob = _number(value)
        if not isinstance(token, str) or logprob is None or not isinstance(candidates, dict):
            return None
        top = [(str(t), v) for t, raw in candidates.items() if (v := _number(raw)) is not None]
        if len(top) != len(candidates):
            return None
        top.sort(key=lambda item: -item[1])
        out.append(TokenLogprobs(token, logprob, tuple(top)))
    return out


def read_chunk(choice: dict[str, Any], chat: bool, into: list[TokenLogprobs]) -> bool:
    """Append the log-probs one streamed choice carries to `into`; False when they do not
    read as either API's (nothing appended then). A choice without log-probs is fine."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return True
    if not isinstance(logprobs, dict):
        return False
    if chat:
        content = logprobs.get("content")
        if content is None:
            return True
        if not isinstance(content, list):
            return False
        entries = [_chat_entry(entry) for entry in content]
        if any(entry is None for entry in entries):
            return False
        into.extend(entry for entry in entries if entry is not None)
        return True
    read = _completion_entries(logprobs)
    if read is None:
        return False
    into.extend(read)
    return True
