"""The traffic mix of one minute of mirrored requests: each category's share, and the
prompt length and n-gram repetition of the requests sampled. A drop in live acceptance
with the suites steady and this mix moved is a traffic change, not an engine's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from canaryd.traffic.requests import LiveRequest

__all__ = ["NGRAM", "WindowMix", "ngram_repetition", "window_mix"]

NGRAM = 3  # word n-grams: prompt lookup drafts from the prompt's own repeated n-grams


@dataclass(frozen=True, slots=True)
class WindowMix:
    """One closed minute: `shares` of the usable requests per category (summing to 1;
    empty when none came), and the mean prompt length and repetition of those sampled
    (None when none was)."""

    shares: Mapping[str, float]
    prompt_chars: float | None
    repetition: float | None


def ngram_repetition(text: str, n: int = NGRAM) -> float:
    """The share of the word n-grams of `text` that repeat an earlier one (0 when it has
    none): high for code and templated prompts, where prompt lookup drafts well."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return (len(grams) - len(Counter(grams))) / len(grams)


def window_mix(seen: Mapping[str, int], sampled: Sequence[LiveRequest]) -> WindowMix:
    """The mix of a window from its requests per category and its sample."""
    total = sum(seen.values())
    shares = {category: n / total for category, n in sorted(seen.items())} if total else {}
    if not sampled:
        return WindowMix(shares, None, None)
    texts = ["\n".join(m.content for m in request.messages) for request in sampled]
    return WindowMix(
        shares,
        sum(len(text) for text in texts) / len(texts),
        sum(ngram_repetition(text) for text in texts) / len(texts),
    )
