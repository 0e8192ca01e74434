"""Scoring a pair: consistency between the arms, degeneration, and task quality.

`score_pair` turns the two `GenerationResult`s of a pair into `PairScores`;
`evaluate_check` grades one answer against a prompt's `Check`. The text metrics
(ROUGE-L, chrF, token edit similarity: `text_metrics`, on sacrebleu and rapidfuzz) are
loaded once per process (`load_metrics`); see docs/scoring.md for every definition.
"""

from __future__ import annotations

from canaryd.scoring.checks import evaluate_check, extract_json, last_number, normalise_answer
from canaryd.scoring.loading import (
    CHRF,
    ROUGE_L,
    TOKEN_EDIT_SIMILARITY,
    ScoringMetrics,
    load_metrics,
)
from canaryd.scoring.loops import RepetitionLoop, find_repetition_loop, has_repetition_loop
from canaryd.scoring.pair import first_divergence, score_pair, task_score

__all__ = [
    "CHRF",
    "ROUGE_L",
    "TOKEN_EDIT_SIMILARITY",
    "RepetitionLoop",
    "ScoringMetrics",
    "evaluate_check",
    "extract_json",
    "find_repetition_loop",
    "first_divergence",
    "has_repetition_loop",
    "last_number",
    "load_metrics",
    "normalise_answer",
    "score_pair",
    "task_score",
]
