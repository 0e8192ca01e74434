"""The tie margin measured on the deployment: every divergent pair's margin, and a tail
bound on their distribution.

A healthy deployment diverges from its own greedy output only through numerics (batch
shapes, kernels, a replica's hardware); how far apart the baseline model finds the tokens
of such divergences is the deployment's own noise. This module owns the two halves of
measuring it: `divergent_margins` judges every divergent token of one greedy pair with
the teacher the daemon uses (canaryd.scoring.margins: the second output teacher-forced
through the baseline where the baseline can score it, else the first divergence from the
baseline's own top log-probs; a lower bound, `bound`, measures nothing and is counted
apart) and gives the pair's margin as the quality gate judges it (`Measured.margin`: the
largest), and `tail_bound` turns independent margins into the smallest margin m such
that, with `TAIL_CONFIDENCE`, P(|margin| > m) ≤ 1 − `TAIL_COVERAGE`: the k-th smallest
margin, k the smallest order with P(Binomial(n, coverage) ≤ k − 1) ≥ confidence (a
distribution-free upper tolerance bound; equivalently, the one-sided Clopper–Pearson
upper bound on the share of margins above m, from the n − k seen above it, is within
1 − coverage). Fewer than `min_divergences()` margins (119 at 97.5 % and 95 %) bound
nothing: None.

The bound needs independent margins, so it takes one per divergent pair, never one per
token: the divergent tokens of one pair share its prompt, its prefix and the state of the
kernels that produced them, and their margins cluster (a pair that diverged once on a
close call diverges again on the next). Pooled, the tokens claim more evidence than they
hold: on 400 seeded samples of 119, 200 and 400 divergent pairs with clustered margins
(tests/canaryd/judging/test_calibration.py: a log-normal scale per pair, about ten
tokens each) the pooled bound covered the tokens' 97.5 % quantile in 82.5, 76 and 82.5 % of
them, against the 95 % claimed; one margin per pair covered the pairs' quantile in 97.75,
96.5 and 99 %. Pairs of distinct prompts are independent, and the pair's largest margin is
what the quality gate compares with the tie margin: a pair is a tie only when every
divergent token of it is within the margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import structlog
from scipy.stats import binom

from canaryd.scoring.margins import combined, top_logprobs_margin
from engine.base import Engine
from engine.types import GenerationResult
from gates.records import Prompt

__all__ = [
    "TAIL_CONFIDENCE",
    "TAIL_COVERAGE",
    "TAIL_METHOD",
    "Measured",
    "divergent_margins",
    "min_divergences",
    "tail_bound",
]

log = structlog.get_logger(__name__)

TAIL_COVERAGE = 0.975  # P(|margin| ≤ m | divergence) the bound covers
TAIL_CONFIDENCE = 0.95  # with this confidence
TAIL_METHOD = "order statistic (distribution-free upper tolerance bound, Clopper–Pearson)"


def _order(n: int, coverage: float, confidence: float) -> int | None:
    """The smallest k (1-based) with P(X_(k) ≥ the coverage quantile) ≥ confidence: the
    k-th smallest of n draws bounds the quantile; None when even the largest does not."""
    if n <= 0:
        return None
    # P(X_(k) ≥ ξ) = P(fewer than k of the n draws fall below ξ) = P(Bin(n, q) ≤ k − 1):
    # k − 1 is the binomial's `confidence` quantile (the smallest j with cdf(j) ≥ it).
    k = int(binom.ppf(confidence, n, coverage)) + 1
    return k if k <= n else None


def min_divergences(coverage: float = TAIL_COVERAGE, confidence: float = TAIL_CONFIDENCE) -> int:
    """The fewest independent margins (divergent pairs) that bound the `coverage`
    quantile with `confidence`: the largest of n bounds it once 1 − coverageⁿ ≥
    confidence."""
    return math.ceil(math.log(1.0 - confidence) / math.log(coverage))


def tail_bound(
    margins: list[float],
    coverage: float = TAIL_COVERAGE,
    confidence: float = TAIL_CONFIDENCE,
) -> float | None:
    """The smallest observed margin m with P(|margin| > m) ≤ 1 − `coverage` at
    `confidence` (module docstring), of independent `margins` (one per divergent pair);
    None with too few margins to say."""
    if not 0.0 < coverage < 1.0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"coverage and confidence must lie in (0, 1): {coverage}, {confidence}")
    ordered = sorted(abs(m) for m in margins)
    k = _order(len(ordered), coverage, confidence)
    return None if k is None else ordered[k - 1]


@dataclass(frozen=True, slots=True)
class Measured:
    """One pair's divergent tokens: each measured margin (nats), how many divergences only
    a lower bound (`bound`) or nothing judged, and the pair's margin as the quality gate
    judges it (`judged`: the largest of its tokens' and its first divergence's; None:
    the largest token margin)."""

    margins: tuple[float, ...] = ()
    unmeasured: int = 0
    judged: float | None = None

    @property
    def diverged(self) -> bool:
        return bool(self.margins) or self.unmeasured > 0

    @property
    def margin(self) -> float | None:
        """The pair's one margin (the unit of the tail bound); None: nothing measured."""
        if self.judged is not None:
            return self.judged
        return max(self.margins, default=None)


def divergent_margins(
    teacher: Engine, prompt: Prompt, baseline: GenerationResult, speculative: GenerationResult
) -> Measured:
    """Every divergent token's |margin| of one greedy pair, judged as the daemon judges
    it: the teacher-forced gaps of the second output (every token off the teacher's
    argmax) where `teacher` scores it, else the first divergence from the baseline's top
    log-probs; and the pair's margin. Outputs that agree: nothing."""
    if baseline.text == speculative.text and baseline.token_ids == speculative.token_ids:
        return Measured()
    try:
        forced = teacher.score(prompt.messages, speculative)
        first = top_logprobs_margin(baseline, speculative) if baseline.token_logprobs else None
    except Exception:  # a scoring bug must not lose the calibration
        log.exception("calibrate.score_failed")
        return Measured(unmeasured=1)
    gaps = tuple(abs(gap) for gap in forced.gaps if gap > 0.0) if forced is not None else ()
    if gaps:
        judged = combined(first, gaps)  # the daemon's rule: the first divergence counts too
        return Measured(gaps, judged=judged.margin if judged is not None else None)
    if first is not None and first.judge == "first":
        return Measured((first.margin,))
    # Scored and no token off the argmax: the outputs differ where the teacher has no
    # view (a token the scorer could not align); else only a lower bound, or nothing.
    return Measured(unmeasured=1)
