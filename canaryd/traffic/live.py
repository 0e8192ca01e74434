"""Live pairs: a sampled mirrored request as the prompt a pair replays, which source the
next pair comes from, and what of a live pair is stored.

Privacy by default: unless `traffic.store_text` is true, a live pair is stored without
any text — its prompt's messages, both outputs and their token ids (which a tokenizer
turns back into text) and the engines' error details (which may quote the request) are
dropped before the pair reaches the store, its buffer or the quarantine file. What stays
is the prompt's keyed hash (its id), its category, the token counts, every timing and
acceptance figure, and the scores, computed in memory on the whole pair beforehand.
"""

from __future__ import annotations

from dataclasses import replace

from canaryd.pairs.runner import OwnSampling
from canaryd.traffic.requests import LiveRequest
from engine.types import GenerationResult
from gates.records import PairRecord, Prompt

__all__ = ["LIVE_SUITE", "SourceMix", "live_prompt", "own_sampling", "stored_record"]

LIVE_SUITE = "live"  # the suite name of every live prompt


def live_prompt(request: LiveRequest) -> Prompt:
    """The prompt a live pair replays: named by the request's keyed hash."""
    return Prompt(
        id=request.prompt_hash,
        category=request.category,
        messages=request.messages,
        max_tokens=request.max_tokens,
        suite=LIVE_SUITE,
        source="mirror",
    )


def own_sampling(request: LiveRequest) -> OwnSampling:
    """The mirrored request's own sampling."""
    return OwnSampling(
        temperature=request.temperature,
        top_p=request.top_p,
        max_tokens=request.max_tokens,
        stop=request.stop,
    )


def _without_text(result: GenerationResult) -> GenerationResult:
    return replace(result, text="", token_ids=(), error_detail="")


def stored_record(record: PairRecord, *, store_text: bool) -> PairRecord:
    """What is stored of `record`: a control pair or, with `store_text`, a live one as
    it is; otherwise a live pair without its prompt's messages, outputs, token ids and
    error details (its figures and scores all kept)."""
    if record.source != "live" or store_text:
        return record
    return replace(
        record,
        prompt=replace(record.prompt, messages=()),
        baseline=_without_text(record.baseline),
        speculative=_without_text(record.speculative),
    )


class SourceMix:
    """Which source the next pair comes from: `live` for `live_share` of the pairs while
    live requests wait (evenly spread: 0.5 alternates), else `control`. A pair that finds
    no live request waiting is a control pair and earns the live source no credit, so a
    quiet spell is never followed by a burst of live pairs."""

    def __init__(self) -> None:
        self._credit = 0.0

    def next_is_live(self, live_share: float, live_waiting: bool) -> bool:
        if not live_waiting or live_share <= 0:
            return False
        self._credit += live_share
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            return True
        return False
