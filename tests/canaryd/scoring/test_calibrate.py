"""The tie margin's tail bound and the margins it is computed from
(canaryd.scoring.calibrate): the order-statistic bound agrees with Clopper–Pearson on the
exceedances it leaves, covers the 97.5 % quantile in at least 95 % of seeded samples,
refuses to bound fewer than 119 margins, and every divergent token is measured by the
same judge the daemon uses (a lower bound measures nothing)."""

from __future__ import annotations

import math
import random

import pytest

from canaryd.scoring.calibrate import (
    TAIL_CONFIDENCE,
    TAIL_COVERAGE,
    Measured,
    divergent_margins,
    min_divergences,
    tail_bound,
)
from engine.types import TeacherScore
from gates.stats.descriptive import clopper_pearson
from tests.canaryd.scoring.test_margins import BASE, EXTRACTION, llamacpp_judge, speculative


class TestTailBound:
    def test_119_margins_are_the_fewest_that_bound(self) -> None:
        """0.975¹¹⁹ ≤ 0.05 < 0.975¹¹⁸: below 119 even the largest margin is no bound."""
        assert min_divergences() == 119
        margins = [i / 1000 for i in range(1, 119)]
        assert tail_bound(margins) is None
        assert tail_bound([*margins, 0.5]) == 0.5  # then the largest is the bound
        assert tail_bound([]) is None

    @pytest.mark.parametrize("n", [119, 200, 500, 1000, 5000])
    def test_the_bound_is_clopper_pearsons_on_the_margins_left_above_it(self, n: int) -> None:
        """Of n distinct margins, the bound leaves j above it: the one-sided 95 %
        Clopper–Pearson upper bound on the share above is within 2.5 % for j, and is not
        for j + 1 (the next smaller margin would not do)."""
        margins = [i / n for i in range(1, n + 1)]
        bound = tail_bound(margins)
        assert bound is not None
        above = sum(1 for m in margins if m > bound)
        assert clopper_pearson(above, n, TAIL_CONFIDENCE)[1] <= 1 - TAIL_COVERAGE
        assert clopper_pearson(above + 1, n, TAIL_CONFIDENCE)[1] > 1 - TAIL_COVERAGE

    def test_known_sample(self) -> None:
        """1000 margins 0.001 … 1.000: the 984th smallest, 16 left above it
        (P(Bin(1000, 0.975) ≤ 983) = 0.964 ≥ 0.95 > 0.942 = P(… ≤ 982))."""
        assert tail_bound([i / 1000 for i in range(1, 1001)]) == pytest.approx(0.984)

    def test_it_covers_the_quantile_with_the_stated_confidence(self) -> None:
        """Exponential margins (true P(margin > m) = e^−m), 400 seeded samples of 300: the
        bound covers the 97.5 % quantile in at least 95 % of them (less some sampling
        slack) and is not wildly conservative (the mean true exceedance stays above 0.5 %)."""
        rng = random.Random(7)
        exceedances = []
        for _ in range(400):
            bound = tail_bound([rng.expovariate(1.0) for _ in range(300)])
            assert bound is not None
            exceedances.append(math.exp(-bound))
        covered = sum(1 for p in exceedances if p <= 1 - TAIL_COVERAGE) / len(exceedances)
        assert covered >= 0.93
        assert 0.005 < sum(exceedances) / len(exceedances) < 1 - TAIL_COVERAGE

    def test_margins_count_by_their_size(self) -> None:
        """A teacher preferring the speculative token by 0.9 is as far as the reverse."""
        margins = [0.1] * 118 + [-0.9]
        assert tail_bound(margins) == pytest.approx(0.9)

    def test_coverage_and_confidence_must_be_probabilities(self) -> None:
        with pytest.raises(ValueError, match="coverage and confidence"):
            tail_bound([0.1] * 200, coverage=1.0)


class TestDivergentMargins:
    def test_outputs_that_agree_have_none(self) -> None:
        assert divergent_margins(llamacpp_judge(), EXTRACTION, BASE, BASE) == Measured()
        assert not Measured().diverged

    def test_the_first_divergence_from_the_baselines_top_logprobs(self) -> None:
        """A llama.cpp baseline scores nothing: its own listed log-probs judge the first
        divergent token (0.3 nats between " the" and " a")."""
        measured = divergent_margins(llamacpp_judge(), EXTRACTION, BASE, speculative("Red a sky"))
        assert measured.margins == (pytest.approx(0.3),)
        assert measured.unmeasured == 0 and measured.diverged

    def test_a_lower_bound_measures_nothing(self) -> None:
        """The speculative token not among the listed candidates: only a lower bound on
        its margin is known, counted apart and never as a margin."""
        measured = divergent_margins(llamacpp_judge(), EXTRACTION, BASE, speculative("Red dog"))
        assert measured == Measured(unmeasured=1)

    def test_the_pairs_margin_is_the_one_the_gate_judges(self) -> None:
        """A teacher that forces the speculative output (gaps 0.1 and 0.2 off its argmax)
        and a first divergence 0.3 nats wide from the baseline's top log-probs: the tokens
        are 0.1 and 0.2, the pair's one margin (the bound's unit) 0.3, the largest of
        both, as `canaryd.scoring.margins.combined` judges the pair in the daemon."""

        class ForcingTeacher:
            def score(self, messages: object, output: object) -> TeacherScore:
                return TeacherScore(3, 1.0, 0.5, 0.5, gaps=(0.0, 0.1, 0.2))

        measured = divergent_margins(
            ForcingTeacher(),  # type: ignore[arg-type]
            EXTRACTION,
            BASE,
            speculative("Red a sky"),
        )
        assert measured.margins == (0.1, 0.2)
        assert measured.margin == pytest.approx(0.3)
        assert Measured((0.1, 0.4)).margin == 0.4 and Measured(unmeasured=1).margin is None
