"""Sentence-level chrF (sacrebleu), as an `evaluate` metric module.

Shipped with canaryd and loaded from its directory with ``evaluate.load(path)``: the
hub's own "chrf" module is unreachable here. chrF compares character n-grams (n = 1..6,
beta = 2, whitespace removed), so it needs no tokenizer and works on CJK text as is.
This file is an `evaluate` script: it must stay importable on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import evaluate
from sacrebleu.metrics.chrf import CHRF

_DESCRIPTION = """chrF (character n-gram F-score, Popović 2015) of each prediction against
its reference, as computed by sacrebleu, on a 0..100 scale."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted texts.
    references: list of reference texts, one per prediction.
Returns:
    chrf: mean sentence-level chrF over the pairs, 0..100.
Examples:
    >>> chrf = evaluate.load("canaryd/scoring/evaluate_modules/canaryd_chrf")
    >>> chrf.compute(predictions=["abc"], references=["abc"])["chrf"]
    100.0
"""

_CITATION = """@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja", booktitle = "Proceedings of the Tenth Workshop on
    Statistical Machine Translation", year = "2015", pages = "392--395"}"""

# One scorer for the process: CHRF() is stateless between sentence_score calls.
_CHRF = CHRF()


def chrf_score(prediction: str, reference: str) -> float:
    """Sentence chrF of one prediction against one reference, 0..100."""
    return float(_CHRF.sentence_score(prediction, [reference]).score)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CanarydChrf(evaluate.Metric):  # type: ignore[misc]
    """Sentence-level chrF."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(self, predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        scores = [
            chrf_score(prediction, reference)
            for prediction, reference in zip(predictions, references, strict=True)
        ]
        return {"chrf": sum(scores) / max(len(scores), 1)}
