"""Draft-length recommendations on synthetic pairs whose acceptance per position and
verify-step cost are known, so the right draft length can be worked out by hand."""

from __future__ import annotations

import itertools
import math
import random
from datetime import UTC, datetime

import pytest

from canaryd.report.recommend import (
    fit_step_cost,
    recommend_draft_length,
    recommend_draft_lengths,
)
from canaryd.store.rollup import ArmFacts, PairFacts

AT = datetime(2025, 1, 1, tzinfo=UTC)
BASE_TPOT = 0.02


def pair(
    index: int,
    *,
    category: str = "qa",
    cap: int = 8,
    accept: float = 0.6,
    steps: int = 100,
    c0: float = 1.0,
    c1: float = 0.25,
    noise: float = 0.0,
    positions: bool = True,
    ok: bool = True,
) -> PairFacts:
    """A pair whose speculative arm drafted `cap` tokens on each of `steps` verify steps and
    kept the first i with probability `accept`^i (exactly, in expectation); a step costs
    (c0 + c1 × drafted) baseline token times, times 1 + `noise` × a seeded N(0, 1)."""
    accepted = [round(steps * accept ** (i + 1)) for i in range(cap)]
    drafted = [steps] * cap
    tokens = steps + sum(accepted)
    jitter = 1.0 + noise * random.Random(index).gauss(0.0, 1.0)
    step_time = BASE_TPOT * (c0 + c1 * cap) * jitter
    spec_tpot = step_time * (steps - 1) / (tokens - 1)
    error = "none" if ok else "http"
    return PairFacts(
        pair_id=f"p{index}",
        category=category,
        started_at=AT,
        baseline=ArmFacts("none", tokens, BASE_TPOT * tokens, 0.05, BASE_TPOT),
        speculative=ArmFacts(error, tokens, spec_tpot * tokens, 0.05, spec_tpot),
        verify_steps=steps,
        draft_tokens=steps * cap,
        accepted_tokens=sum(accepted),
        accepted_per_position=tuple(accepted) if positions else (),
        drafted_per_position=tuple(drafted) if positions else (),
        exact_match=True,
        task_score_delta=None,
    )


def varied(n: int = 40, **kwargs: object) -> list[PairFacts]:
    """Pairs whose draft caps cycle through 4 … 8 (an engine that adapts its drafts)."""
    return [pair(i, cap=4 + i % 5, **kwargs) for i in range(n)]  # type: ignore[arg-type]


def expected_speedup(k: int, pairs: list[PairFacts], c0: float, c1: float) -> float:
    """The closed form the module must reproduce: per step, E[L](k) over c0 + c1·D(k)."""
    steps = sum(p.verify_steps or 0 for p in pairs)
    accepted = sum(sum((p.accepted_per_position or ())[:k]) for p in pairs)
    drafted = sum(sum((p.drafted_per_position or ())[:k]) for p in pairs)
    return (1 + accepted / steps) / (c0 + c1 * drafted / steps)


class TestRecommendation:
    def test_the_best_draft_length_of_a_known_model(self) -> None:
        """Acceptance 0.6^i and a step cost of 1 + 0.25 k: k = 2 is best (1.31× against
        1.28× at k = 1 and 1.24× at k = 3)."""
        pairs = varied()
        rec = recommend_draft_length("qa", pairs)
        assert rec.draft_length == 2
        assert rec.cost is not None
        assert rec.cost.intercept == pytest.approx(1.0, abs=1e-6)
        assert rec.cost.per_draft_token == pytest.approx(0.25, abs=1e-6)
        assert rec.measured_k == 8 and rec.pairs == 40
        for k in range(1, 9):
            assert rec.expected_speedup[k - 1] == pytest.approx(
                expected_speedup(k, pairs, 1.0, 0.25)
            )
        assert rec.acceptance_by_position[0] == pytest.approx(0.6)
        assert rec.reason.startswith("draft length 2: expected 1.96 tokens per verify step")
        assert "1.000 + 0.250·k baseline token times" in rec.reason

    def test_cheap_drafts_make_the_longest_measured_best(self) -> None:
        """With drafted tokens almost free the longest measured draft wins, and the
        recommendation says longer ones were not measured."""
        rec = recommend_draft_length("qa", varied(c1=0.01, accept=0.9))
        assert rec.draft_length == rec.measured_k == 8
        assert "longer ones are unmeasured" in rec.reason

    def test_a_losing_category_is_told_to_turn_speculation_off(self) -> None:
        rec = recommend_draft_length("math", varied(category="math", accept=0.1))
        assert rec.draft_length == 0
        assert rec.reason.startswith("speculation off (k=0)")
        assert max(rec.expected_speedup) < 1.0

    def test_expected_length_grows_with_k(self) -> None:
        rec = recommend_draft_length("qa", varied())
        lengths = rec.expected_length
        assert all(b > a for a, b in itertools.pairwise(lengths))
        assert lengths[-1] == pytest.approx(rec.measured_length)

    def test_a_position_drafted_too_rarely_is_not_a_candidate(self) -> None:
        """Positions 5 … 8 are drafted by fewer pairs (1600 … 400 drafts against 2000):
        with a bar of 1700 only 1 … 4 count."""
        pairs = varied(n=20)
        rec = recommend_draft_length("qa", pairs, min_drafted=1700)
        assert rec.measured_k == 4 and len(rec.expected_speedup) == 4


class TestNoRecommendation:
    def test_without_per_position_figures(self) -> None:
        rec = recommend_draft_length("qa", [pair(i, positions=False) for i in range(30)])
        assert rec.draft_length is None
        assert rec.reason == "no pair reports acceptance per draft position"

    def test_too_few_pairs(self) -> None:
        rec = recommend_draft_length("qa", varied(n=10))
        assert rec.draft_length is None and rec.reason.startswith("too few pairs: 10")

    def test_failed_pairs_do_not_count(self) -> None:
        pairs = [*varied(n=10), *(pair(100 + i, ok=False) for i in range(30))]
        assert recommend_draft_length("qa", pairs).pairs == 10

    def test_the_same_draft_length_everywhere_cannot_fit_a_cost(self) -> None:
        """Every pair drafted 8 tokens per step: the cost of a drafted token cannot be told
        from the cost of the step, and it says so instead of guessing."""
        rec = recommend_draft_length("qa", [pair(i, cap=8) for i in range(40)])
        assert rec.draft_length is None and rec.cost is None
        assert "cannot fit the verify-step cost: every pair drafted 8.00 tokens" in rec.reason
        assert rec.expected_length  # the acceptance evidence is still shown

    def test_noisy_step_times_are_too_uncertain(self) -> None:
        rec = recommend_draft_length("qa", varied(n=20, noise=0.5))
        assert rec.draft_length is None
        assert "the cost per drafted token is uncertain" in rec.reason

    def test_noise_averages_out_over_many_pairs(self) -> None:
        rec = recommend_draft_length("qa", varied(n=400, noise=0.05))
        assert rec.draft_length == 2


class TestFit:
    def test_a_negative_slope_is_held_at_zero(self) -> None:
        model, problem = fit_step_cost([(1.0, 2.0), (2.0, 1.9), (3.0, 1.8), (4.0, 1.7)], 4)
        assert model is not None and problem == ""
        assert model.slope_held_at_zero and model.per_draft_token == 0.0
        assert model.intercept == pytest.approx(1.85)

    def test_a_non_positive_fixed_cost_is_refused(self) -> None:
        model, problem = fit_step_cost([(1.0, 0.1), (2.0, 1.1), (3.0, 2.1)], 3)
        assert model is None and "≤ 0" in problem

    def test_too_few_samples(self) -> None:
        model, problem = fit_step_cost([(1.0, 1.0), (2.0, 2.0)], 2)
        assert model is None and problem.startswith("2 pairs")

    def test_an_exact_line_has_no_uncertainty(self) -> None:
        model, _ = fit_step_cost([(x, 1.0 + 0.5 * x) for x in (1.0, 2.0, 3.0)], 3)
        assert model is not None and math.isclose(model.slope_se, 0.0, abs_tol=1e-12)


def test_one_recommendation_per_category_as_json() -> None:
    pairs = [*varied(), *varied(category="math", accept=0.1)]
    recs = recommend_draft_lengths(pairs)
    assert list(recs) == ["math", "qa"]
    data = recs["qa"].as_json()
    assert data["draft_length"] == 2 and data["cost"]["per_draft_token"] == pytest.approx(0.25)
    assert len(data["expected_speedup"]) == 8
    assert recs["math"].summary().startswith("math: speculation off")
