"""Judging a greedy divergence: how far the speculative arm's tokens are from the baseline's.

A lossless speculative arm reproduces greedy output up to hardware numerics, so where two
greedy outputs differ the baseline (target) model must find the speculative tokens
nearly as likely as its own choices. Three judges, the best one available deciding:
- `forced`: the speculative output teacher-forced through the baseline
  (`Engine.score`'s per-token `gaps`: the in-process engine, vLLM's prompt log-probs);
  every token is judged by its distance from the teacher's argmax, together with the
  first divergent token's margin;
- `first`: the baseline's own top log-probs along its output (`token_logprobs`, every
  OpenAI-compatible server that returns them): at the first divergent token the margin is
  log p(baseline token) − log p(speculative token). Later tokens follow a prefix the
  baseline never generated, so only the first divergence is judged there;
- `bound`: as `first`, but the speculative token is not among the listed candidates:
  the margin is at least log p(baseline token) − log p(last listed candidate), a lower
  bound that proves a real divergence when it is past the tie margin, and never a tie.
Margins are absolute: a teacher that prefers the speculative token by a wide margin says
the two arms disagree as much as one that prefers the baseline's.

Streamed results carry text, not token ids: the speculative token at the first
divergence is the longest listed candidate its text continues with, looking one token
back for a longer candidate than the baseline's (" then" where the baseline took " the",
the texts parting a token later). A shorter candidate can stand for a longer token the
server did not list; the margin is then the one of that candidate.

Where one output ends inside the other the arms still chose differently, at the shorter
one's end, and it is judged there:
- the speculative arm ended (`finish_reason` "stop") where the baseline went on: its
  token is the end of the output, which servers list as a candidate that spells nothing
  (llama.cpp renders the end token as empty text); `bound` when none is listed. (A stop
  string it met and the baseline did not is judged the same way.)
- the baseline ended where the speculative arm went on: at the baseline's end token when
  the server listed one (a last entry that spells nothing); llama.cpp lists none, so
  nothing was listed at that position: `bound` with margin 0 (the baseline found the end
  at least as likely as the speculative token, by how much it did not say), counted as
  real, never a tie;
- the shorter output ran out of `max_tokens` ("length") on text the other shares: the
  arms spelled that text in different tokens somewhere, at a position no listed
  candidate reveals: `bound`, 0.
Nothing judges a divergence (None) only where the baseline's log-probs do not spell its
text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine.types import GenerationResult, TokenLogprobs

Judge = Literal["forced", "first", "bound"]


@dataclass(frozen=True, slots=True)
class Judged:
    """One divergence's judgement: the largest absolute margin judged (nats) and how."""

    margin: float
    judge: Judge


# A divergence at a position the server listed no candidates for: the margin is at
# least 0 and no more is known (never a tie, counted as real).
NOTHING_LISTED = Judged(0.0, "bound")


def top_logprobs_margin(baseline: GenerationResult, speculative: GenerationResult) -> Judged | None:
    """The first divergence judged by the baseline's own top log-probs (`first` or
    `bound`); None without log-probs, when they do not spell the baseline's text, or
    when the two texts agree."""
    tokens: tuple[TokenLogprobs, ...] = baseline.token_logprobs
    text = speculative.text
    if not tokens:
        return None
    at = 0
    last = len(tokens) - 1
    for index, token in enumerate(tokens):
        if index == last and at == len(baseline.text) and baseline.finish_reason == "stop":
            # Past its text: the baseline's end token, as the server listed it.
            if at == len(text):
                return None  # the texts agree
            return _judged(token, _listed(token, text[at:], 0))
        if not baseline.text.startswith(token.token, at):
            return None  # the log-probs do not follow the text: nothing to align
        if text.startswith(token.token, at):
            at += len(token.token)
            continue
        if at == len(text):  # the speculative output ends here, the baseline's goes on
            if speculative.finish_reason != "stop":
                return NOTHING_LISTED  # out of tokens on the shared text
            return _judged(token, _listed_end(token))
        if index > 0:
            # The previous token's text matched, but the speculative arm may have taken a
            # longer listed token there (" then" where the baseline took " the").
            before = tokens[index - 1]
            start = at - len(before.token)
            longer = _listed(before, text[start:], len(before.token))
            if longer is not None:
                return Judged(abs(before.logprob - longer), "first")
        return _judged(token, _listed(token, text[at:], 0))
    if at < len(baseline.text):
        return None  # the log-probs stop short of the text: nothing to align
    if at == len(text):
        return None  # the texts agree
    # The baseline's output ends here and the speculative arm's goes on; the server
    # listed nothing for the baseline's end (llama.cpp), or it ran out of tokens.
    return NOTHING_LISTED


def _judged(token: TokenLogprobs, listed: float | None) -> Judged:
    """The margin at `token`'s position to a listed candidate's log-prob (`first`), or,
    the candidate unlisted, a lower bound to the last listed one (`bound`)."""
    if listed is not None:
        return Judged(abs(token.logprob - listed), "first")
    if not token.top:
        return NOTHING_LISTED
    floor = min(value for _, value in token.top)
    return Judged(max(token.logprob - floor, 0.0), "bound")


def _listed_end(token: TokenLogprobs) -> float | None:
    """The log-prob of a listed candidate that spells nothing (the end of the output, as
    servers render it) other than `token`; None when none is."""
    ends = [value for text, value in token.top if not text and text != token.token]
    return max(ends) if ends else None


def _listed(token: TokenLogprobs, rest: str, longer_than: int) -> float | None:
    """The log-prob of the longest listed candidate other than `token` that `rest` starts
    with, longer than `longer_than` characters; None when none is."""
    listed = [
        (len(text), value)
        for text, value in token.top
        if len(text) > longer_than and text != token.token and rest.startswith(text)
    ]
    return max(listed)[1] if listed else None


def combined(first: float | Judged | None, gaps: Sequence[float]) -> Judged | None:
    """The pair's judgement from its first divergence (a two-pass margin or a top-log-probs
    judgement) and the teacher-forced gaps of the speculative output (empty: none)."""
    if isinstance(first, float):
        first = Judged(abs(first), "first")
    if gaps:
        largest = max(gaps)
        if first is not None and first.judge != "bound":
            largest = max(largest, first.margin)
        return Judged(largest, "forced")
    return first
