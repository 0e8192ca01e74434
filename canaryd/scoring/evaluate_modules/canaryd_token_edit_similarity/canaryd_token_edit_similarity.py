"""Token edit similarity (1 - normalised Levenshtein distance), as an `evaluate` module.

Shipped with canaryd and loaded from its directory with ``evaluate.load(path)``. It
compares sequences of token ids (or of any hashable items) with rapidfuzz:
similarity = 1 - distance / max(len(a), len(b)), and 1.0 for two empty sequences.
This file is an `evaluate` script: it must stay importable on its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import datasets
import evaluate
from rapidfuzz.distance import Levenshtein

_DESCRIPTION = """1 - normalised Levenshtein distance between two token-id sequences
(insertions, deletions and substitutions cost 1; normalised by the longer length)."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of token-id sequences.
    references: list of token-id sequences, one per prediction.
Returns:
    token_edit_similarity: mean similarity over the pairs, 0..1.
Examples:
    >>> sim = evaluate.load("canaryd/scoring/evaluate_modules/canaryd_token_edit_similarity")
    >>> sim.compute(predictions=[[1, 2, 4]], references=[[1, 2, 3, 4]])["token_edit_similarity"]
    0.75
"""

_CITATION = """@article{levenshtein1966binary,
    title={Binary codes capable of correcting deletions, insertions, and reversals},
    author={Levenshtein, Vladimir I}, journal={Soviet Physics Doklady}, volume={10},
    number={8}, pages={707--710}, year={1966}}"""


def token_edit_similarity(prediction: Sequence[Hashable], reference: Sequence[Hashable]) -> float:
    """1 - Levenshtein(prediction, reference) / max length; 1.0 when both are empty."""
    if not prediction and not reference:
        return 1.0
    return float(Levenshtein.normalized_similarity(prediction, reference))


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CanarydTokenEditSimilarity(evaluate.Metric):  # type: ignore[misc]
    """1 - normalised Levenshtein distance over token ids."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("int64")),
                    "references": datasets.Sequence(datasets.Value("int64")),
                }
            ),
            reference_urls=["https://github.com/rapidfuzz/RapidFuzz"],
        )

    def _compute(
        self, predictions: Sequence[Sequence[int]], references: Sequence[Sequence[int]]
    ) -> dict[str, float]:
        scores = [
            token_edit_similarity(prediction, reference)
            for prediction, reference in zip(predictions, references, strict=True)
        ]
        return {"token_edit_similarity": sum(scores) / max(len(scores), 1)}
