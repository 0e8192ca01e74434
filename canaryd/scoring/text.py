"""The units two outputs are compared in when an engine reports no token ids.

Token ids are the natural unit (they are what the decoders emit), but some
OpenAI-compatible servers return text only. Comparing two empty id tuples would call
any two texts identical, so when either arm has text without ids both arms fall back:
characters for divergence and edit similarity, words and punctuation for loops.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence

from engine.types import GenerationResult

# CJK characters one unit each (as in the ROUGE-L tokenizer), words, punctuation marks.
_CJK = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_WORD_UNIT = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


def has_token_ids(result: GenerationResult) -> bool:
    """Whether `result` carries the token ids of its text (empty text needs none)."""
    return bool(result.token_ids) or not result.text


def word_units(text: str) -> list[str]:
    """Words, CJK characters and punctuation marks, in order."""
    return _WORD_UNIT.findall(text)


def comparison_units(
    baseline: GenerationResult, speculative: GenerationResult
) -> tuple[Sequence[Hashable], Sequence[Hashable]]:
    """Token ids of both arms, or both texts' characters when either arm lacks ids."""
    if has_token_ids(baseline) and has_token_ids(speculative):
        return baseline.token_ids, speculative.token_ids
    return baseline.text, speculative.text


def loop_units(result: GenerationResult) -> Sequence[Hashable]:
    """Token ids, or the text's word units when the engine reported no ids."""
    return result.token_ids if has_token_ids(result) else word_units(result.text)
