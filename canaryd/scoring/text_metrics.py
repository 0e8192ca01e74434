"""The three text metrics a pair is scored with: ROUGE-L, chrF and token edit similarity.

Each compares one prediction with one reference and calls the library that computes it
directly: chrF is sacrebleu's sentence chrF (character n-grams, n = 1..6, beta = 2,
whitespace removed: no tokenizer, CJK text as is); token edit similarity is rapidfuzz's
normalised Levenshtein similarity over token ids (1.0 for two empty sequences); ROUGE-L is
rouge-score's definition (``rouge_score.rouge_scorer._score_lcs``: precision = LCS /
prediction tokens, recall = LCS / reference tokens, F = their harmonic mean, 0 when either
side has no tokens) with the LCS length from rapidfuzz (C++; rouge-score's pure-Python
table costs ~1.7 ms for two 100-word texts) and a Unicode-aware tokenizer: rouge-score's
default one drops every non-ASCII character, so Chinese or Japanese text would score 0.
`UnicodeTokenizer` makes each CJK character (Han, kana) one token and every other run of
word characters one lower-cased token; it has rouge-score's tokenizer interface
(`tokenize`), so `rouge_score.rouge_scorer.RougeScorer` accepts it (the tests compare
both). rouge-score itself is not imported here: its tokenizer module imports nltk, and
with it scipy, for a stemmer canaryd does not use.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import NamedTuple

from rapidfuzz.distance import LCSseq, Levenshtein
from sacrebleu.metrics.chrf import CHRF

# Han (incl. extensions A-G and compatibility ideographs), kana, CJK punctuation is
# excluded (it is not a word). Hangul is left to \w+: Korean separates words by spaces.
_CJK = (
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK unified ideographs extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # extensions B-G
)
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")


class RougeScore(NamedTuple):
    """Precision, recall and F-measure, as rouge-score's `scoring.Score`."""

    precision: float
    recall: float
    fmeasure: float


class UnicodeTokenizer:
    """CJK characters one token each; other words by ``\\w+``, lower-cased."""

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower())


TOKENIZER = UnicodeTokenizer()


def rouge_l_score(prediction: Sequence[str], reference: Sequence[str]) -> RougeScore:
    """ROUGE-L of two token sequences, exactly as rouge-score's `_score_lcs` defines it."""
    if not prediction or not reference:
        return RougeScore(precision=0.0, recall=0.0, fmeasure=0.0)
    lcs = LCSseq.similarity(prediction, reference)
    precision = lcs / len(prediction)
    recall = lcs / len(reference)
    fmeasure = 2 * precision * recall / (precision + recall) if lcs else 0.0
    return RougeScore(precision=precision, recall=recall, fmeasure=fmeasure)


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure of two texts, 0..1 (0 when either text has no tokens)."""
    return rouge_l_score(TOKENIZER.tokenize(prediction), TOKENIZER.tokenize(reference)).fmeasure


# One scorer for the process: CHRF() is stateless between sentence_score calls.
_CHRF = CHRF()


def chrf(prediction: str, reference: str) -> float:
    """Sentence chrF of one prediction against one reference, 0..100."""
    return float(_CHRF.sentence_score(prediction, [reference]).score)


def token_edit_similarity(prediction: Sequence[Hashable], reference: Sequence[Hashable]) -> float:
    """1 - Levenshtein(prediction, reference) / max length; 1.0 when both are empty."""
    if not prediction and not reference:
        return 1.0
    return float(Levenshtein.normalized_similarity(prediction, reference))
