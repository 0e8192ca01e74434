"""Draft-length recommendations per category, from the measured acceptance per draft
position and the measured cost of a verify step.

For a category's pairs (both arms succeeded, acceptance per position reported), S verify
steps accepted a_i and drafted d_i tokens at draft position i+1. Capping drafts at k
leaves the first k positions as they were, so per verify step

    E[L](k) = 1 + Σ_{i<k} a_i / S    tokens (the 1 is the target's own token)
    D(k)    = Σ_{i<k} d_i / S        drafted tokens.

A verify step that drafts j tokens costs c0 + c1·j, in units of the baseline's time per
output token. c0 and c1 are fitted by least squares over the pairs: x = drafted tokens
per step, y = the speculative arm's decode time per step after the first (its time per
output token × (tokens − 1) ÷ (steps − 1)) ÷ the same pair's baseline time per token. A
negative slope is held at 0 (a longer draft never makes a step cheaper). The expected
decode speedup of k is E[L](k) / (c0 + c1·D(k)); the recommendation is the shortest k
within 1 % of the best one (shorter drafts waste less compute for the same gain), or 0
(speculation off) when no k is expected to beat the baseline. Only draft lengths that
were measured (each position drafted at least `min_drafted` times) are candidates:
nothing is extrapolated. When the pairs do not pin the cost down — about the same number
of tokens drafted per step in every pair, or too few pairs, so that the draft-dependent
cost at the longest candidate is uncertain by more than a quarter of the fixed cost —
there is no recommendation, and the reason says so instead of assuming a cost.
Arithmetic on measured figures only: no I/O, no clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from canaryd.store.rollup import PairFacts

__all__ = [
    "CostModel",
    "DraftRecommendation",
    "fit_step_cost",
    "recommend_draft_length",
    "recommend_draft_lengths",
]

MIN_PAIRS = 20  # pairs with acceptance per position before anything is recommended
MIN_DRAFTED = 20  # drafts reaching a position before it is a candidate
# The fit is usable when the standard error of c1, times the longest candidate k, is at
# most this share of c0: the ranking of draft lengths then rests on the data.
MAX_COST_UNCERTAINTY = 0.25
NEAR_BEST = 0.99  # within 1 % of the best expected speedup, the shortest k is chosen


@dataclass(frozen=True, slots=True)
class CostModel:
    """A verify step drafting j tokens costs `intercept` + `per_draft_token`·j baseline
    token times; fitted on `pairs` pairs, its slope's standard error `slope_se`."""

    intercept: float
    per_draft_token: float
    slope_se: float
    pairs: int
    slope_held_at_zero: bool = False

    def cost(self, drafted_per_step: float) -> float:
        return self.intercept + self.per_draft_token * drafted_per_step

    def describe(self) -> str:
        held = " (fitted slope negative, held at 0)" if self.slope_held_at_zero else ""
        return (
            f"{self.intercept:.3f} + {self.per_draft_token:.3f}·k baseline token times "
            f"(± {self.slope_se:.3f} per k; {self.pairs} pairs){held}"
        )


@dataclass(frozen=True, slots=True)
class DraftRecommendation:
    """The evidence for one category's draft length and what it recommends.

    `draft_length`: the recommended k; 0 means speculation off; None means no
    recommendation (`reason` says why). Tuples by k run over k = 1 … `measured_k`."""

    category: str
    pairs: int  # pairs with acceptance per position
    verify_steps: int
    measured_k: int  # the longest draft position measured often enough
    acceptance_by_position: tuple[float | None, ...]  # a_i / d_i, accepted of drafted
    expected_length: tuple[float, ...]  # E[L](k)
    measured_length: float | None  # 1 + accepted / steps over the pairs
    measured_speedup: float | None  # median baseline ÷ speculative time per token
    cost: CostModel | None
    expected_speedup: tuple[float, ...]  # E[L](k) / cost(k); empty without a cost model
    draft_length: int | None
    reason: str

    def summary(self) -> str:
        """One line for a person: the recommendation or why there is none."""
        return f"{self.category}: {self.reason}"

    def as_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "draft_length": self.draft_length,
            "reason": self.reason,
            "pairs": self.pairs,
            "verify_steps": self.verify_steps,
            "measured_k": self.measured_k,
            "acceptance_by_position": list(self.acceptance_by_position),
            "expected_length": list(self.expected_length),
            "measured_length": self.measured_length,
            "measured_speedup": self.measured_speedup,
            "expected_speedup": list(self.expected_speedup),
            "cost": None
            if self.cost is None
            else {
                "intercept": self.cost.intercept,
                "per_draft_token": self.cost.per_draft_token,
                "slope_se": self.cost.slope_se,
                "pairs": self.cost.pairs,
                "slope_held_at_zero": self.cost.slope_held_at_zero,
            },
        }


@dataclass(frozen=True, slots=True)
class _StepSample:
    drafted_per_step: float
    step_cost: float  # baseline token times
    speedup: float  # baseline ÷ speculative time per token


def _positions(pair: PairFacts) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    accepted, drafted = pair.accepted_per_position, pair.drafted_per_position
    if not pair.complete or not accepted or not drafted or not pair.verify_steps:
        return None
    return accepted, drafted


def _step_sample(pair: PairFacts) -> _StepSample | None:
    spec, base = pair.speculative, pair.baseline
    steps, drafted = pair.verify_steps, pair.draft_tokens
    if steps is None or steps < 2 or drafted is None or spec.output_tokens < 2:
        return None
    if not spec.tpot_s or not base.tpot_s or spec.tpot_s <= 0 or base.tpot_s <= 0:
        return None
    decode_per_step = spec.tpot_s * (spec.output_tokens - 1) / (steps - 1)
    return _StepSample(drafted / steps, decode_per_step / base.tpot_s, base.tpot_s / spec.tpot_s)


def fit_step_cost(
    samples: Sequence[tuple[float, float]], longest_k: int
) -> tuple[CostModel | None, str]:
    """Least squares of step cost y on drafted tokens per step x over `samples` (x, y);
    the model, or None and why it cannot be fitted."""
    n = len(samples)
    if n < 3:
        return None, f"{n} pairs with step timings (at least 3 needed)"
    xs = [x for x, _ in samples]
    ys = [y for _, y in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx <= 0.0:
        return None, (
            f"every pair drafted {mean_x:.2f} tokens per step: the cost of a drafted token "
            "cannot be told apart from the cost of the step"
        )
    slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / sxx
    held = slope < 0.0
    if held:
        slope = 0.0
    intercept = mean_y - slope * mean_x
    residual = sum((y - intercept - slope * x) ** 2 for x, y in samples)
    slope_se = math.sqrt(residual / (n - 2) / sxx) if n > 2 else math.inf
    if intercept <= 0.0:
        return None, (
            f"the fitted fixed cost of a step is {intercept:.3f} baseline token times "
            "(≤ 0): step times do not follow c0 + c1·k"
        )
    model = CostModel(intercept, slope, slope_se, n, held)
    if slope_se * longest_k > MAX_COST_UNCERTAINTY * intercept:
        spread = statistics.pstdev(xs)
        return None, (
            f"the cost per drafted token is uncertain (± {slope_se:.3f} baseline token times "
            f"per k against a fixed cost of {intercept:.3f}, from {n} pairs whose drafted "
            f"tokens per step spread by sd {spread:.2f}): more pairs or more varied draft "
            "lengths are needed"
        )
    return model, ""


def recommend_draft_length(
    category: str,
    pairs: Sequence[PairFacts],
    *,
    min_pairs: int = MIN_PAIRS,
    min_drafted: int = MIN_DRAFTED,
) -> DraftRecommendation:
    """The recommendation for `category` from its `pairs` (others are ignored)."""
    measured = [(p, pos) for p in pairs if p.category == category and (pos := _positions(p))]
    steps = sum(p.verify_steps or 0 for p, _ in measured)
    width = max((len(d) for _, (_, d) in measured), default=0)
    accepted = [sum(a[i] for _, (a, _) in measured if i < len(a)) for i in range(width)]
    drafted = [sum(d[i] for _, (_, d) in measured if i < len(d)) for i in range(width)]
    longest = 0
    while longest < width and drafted[longest] >= min_drafted:
        longest += 1
    samples = [s for p, _ in measured if (s := _step_sample(p)) is not None]
    speedups = [s.speedup for s in samples]
    lengths = tuple(1.0 + sum(accepted[:k]) / steps for k in range(1, longest + 1))
    evidence = DraftRecommendation(
        category=category,
        pairs=len(measured),
        verify_steps=steps,
        measured_k=longest,
        acceptance_by_position=tuple(
            a / d if d else None for a, d in zip(accepted, drafted, strict=True)
        ),
        expected_length=lengths,
        measured_length=1.0 + sum(p.accepted_tokens or 0 for p, _ in measured) / steps
        if steps
        else None,
        measured_speedup=statistics.median(speedups) if speedups else None,
        cost=None,
        expected_speedup=(),
        draft_length=None,
        reason="",
    )
    if not measured:
        return replace(evidence, reason="no pair reports acceptance per draft position")
    if len(measured) < min_pairs:
        why = f"{len(measured)} with acceptance per position (at least {min_pairs} needed)"
        return replace(evidence, reason=f"too few pairs: {why}")
    if longest == 0:
        return replace(evidence, reason=f"no draft position was drafted {min_drafted} times")
    cost, problem = fit_step_cost([(s.drafted_per_step, s.step_cost) for s in samples], longest)
    if cost is None:
        why = f"no recommendation: cannot fit the verify-step cost: {problem}"
        return replace(evidence, reason=why)
    per_step = [sum(drafted[:k]) / steps for k in range(1, longest + 1)]
    expected = tuple(e / cost.cost(d) for e, d in zip(lengths, per_step, strict=True))
    best = max(expected)
    chosen = next(k for k, s in enumerate(expected, start=1) if s >= NEAR_BEST * best)
    measured_note = (
        f"; measured {evidence.measured_speedup:.2f}× with drafts of up to {width}"
        if evidence.measured_speedup is not None
        else ""
    )
    if best < 1.0:
        reason = (
            f"speculation off (k=0): no measured draft length beats the baseline (best "
            f"k={chosen}: expected {lengths[chosen - 1]:.2f} tokens per step, "
            f"{expected[chosen - 1]:.2f}× decode speed{measured_note})"
        )
        chosen = 0
    else:
        longer = " (the longest measured; longer ones are unmeasured)" if chosen == longest else ""
        reason = (
            f"draft length {chosen}{longer}: expected {lengths[chosen - 1]:.2f} tokens per "
            f"verify step, {expected[chosen - 1]:.2f}× decode speedup{measured_note}; from "
            f"{len(measured)} pairs, step cost {cost.describe()}"
        )
    return replace(
        evidence, cost=cost, expected_speedup=expected, draft_length=chosen, reason=reason
    )


def recommend_draft_lengths(pairs: Sequence[PairFacts]) -> dict[str, DraftRecommendation]:
    """A recommendation per category of `pairs`, sorted by category."""
    return {c: recommend_draft_length(c, pairs) for c in sorted({p.category for p in pairs})}
