"""Descriptive statistics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from gates.stats.descriptive import (
    bootstrap_quantiles,
    clopper_pearson,
    mean,
    mean_t_bounds,
    order_statistic_bounds,
    paired_bootstrap_quantile_ratio,
    quantile,
    rate,
)


class TestQuantile:
    def test_median_of_odd_and_even_samples(self) -> None:
        """The median is the middle value, or the mean of the two middle values."""
        assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
        assert quantile([4.0, 1.0, 2.0, 3.0], 0.5) == 2.5

    def test_linear_interpolation_between_order_statistics(self) -> None:
        """P90 of 1..10 is 1 + 0.9 * 9 = 9.1 (type 7), P99 is 9.91."""
        values = [float(v) for v in range(1, 11)]
        assert quantile(values, 0.9) == pytest.approx(9.1)
        assert quantile(values, 0.99) == pytest.approx(9.91)

    def test_empty_and_non_finite(self) -> None:
        """No finite values: None; NaN and inf are ignored."""
        assert quantile([], 0.5) is None
        assert quantile([float("nan"), 1.0, float("inf"), 3.0], 0.5) == 2.0

    def test_q_out_of_range(self) -> None:
        """A quantile outside [0, 1] is a programming error."""
        with pytest.raises(ValueError, match="outside"):
            quantile([1.0], 1.5)


class TestMeanAndRate:
    def test_mean_and_rate(self) -> None:
        """Mean of 1, 2, 6 is 3; 3 hits in 4 is 0.75; no data is None."""
        assert mean([1.0, 2.0, 6.0]) == 3.0
        assert mean([]) is None
        assert rate(3, 4) == 0.75
        assert rate(0, 0) is None


class TestClopperPearson:
    def test_matches_scipy_exact_interval(self) -> None:
        """One-sided 95 % bounds equal the 90 % two-sided exact interval from scipy."""
        from scipy.stats import binomtest

        interval = binomtest(7, 200).proportion_ci(confidence_level=0.90, method="exact")
        lower, upper = clopper_pearson(7, 200, 0.95)
        assert lower == pytest.approx(interval.low)
        assert upper == pytest.approx(interval.high)

    def test_zero_hits_upper_bound_is_rule_of_three(self) -> None:
        """With no hits in n, the lower bound is 0 and the upper is 1 − 0.05^(1/n) ≈ 3/n."""
        lower, upper = clopper_pearson(0, 300, 0.95)
        assert lower == 0.0
        assert upper == pytest.approx(1 - 0.05 ** (1 / 300))

    def test_all_hits_upper_bound_is_one(self) -> None:
        """With every trial a hit, the upper bound is 1 and the lower is 0.05^(1/n)."""
        lower, upper = clopper_pearson(10, 10, 0.95)
        assert upper == 1.0
        assert lower == pytest.approx(0.05 ** (1 / 10))

    def test_rejects_impossible_counts(self) -> None:
        """More hits than trials is a programming error."""
        with pytest.raises(ValueError, match="hits"):
            clopper_pearson(5, 3, 0.95)


class TestMeanTBounds:
    def test_hand_computed_bounds(self) -> None:
        """Mean 2, sd 1, n 3: half-width t(0.95, 2) · 1/√3 = 2.919986 / 1.732051."""
        centre, lower, upper = mean_t_bounds([1.0, 2.0, 3.0], 0.95)
        half = 2.919986 / math.sqrt(3)
        assert centre == 2.0
        assert lower == pytest.approx(2.0 - half, rel=1e-6)
        assert upper == pytest.approx(2.0 + half, rel=1e-6)

    def test_constant_values_have_zero_width(self) -> None:
        """Identical values give bounds equal to the mean."""
        assert mean_t_bounds([0.0] * 5, 0.95) == (0.0, 0.0, 0.0)


class TestOrderStatisticBounds:
    def test_median_of_five(self) -> None:
        """n=5: the min and max bound the median at 1 − 0.5^5 = 96.9 % ≥ 95 %."""
        assert order_statistic_bounds([5.0, 1.0, 4.0, 2.0, 3.0], 0.5, 0.95) == (1.0, 5.0)

    def test_too_few_values_have_no_bound(self) -> None:
        """n=4: even the min covers the median only at 93.75 %, so there is no bound."""
        assert order_statistic_bounds([1.0, 2.0, 3.0, 4.0], 0.5, 0.95) == (None, None)

    def test_p99_upper_bound_needs_299_values(self) -> None:
        """The P99 has a 95 % upper bound only once 0.99^n ≤ 0.05, i.e. n ≥ 299."""
        assert order_statistic_bounds([float(v) for v in range(298)], 0.99, 0.95)[1] is None
        assert order_statistic_bounds([float(v) for v in range(299)], 0.99, 0.95)[1] == 298.0

    def test_indices_match_binomial_definition(self) -> None:
        """For n=100, q=0.5, c=0.95 the bounds are x(42) and x(59) (scipy binomial)."""
        values = [float(v) for v in range(1, 101)]
        lower, upper = order_statistic_bounds(values, 0.5, 0.95)
        assert binom.cdf(41, 100, 0.5) <= 0.05 < binom.cdf(42, 100, 0.5)
        assert binom.cdf(57, 100, 0.5) < 0.95 <= binom.cdf(58, 100, 0.5)
        assert (lower, upper) == (42.0, 59.0)

    def test_coverage_is_at_least_nominal(self) -> None:
        """In 2,000 seeded samples of 60 exponentials, each bound covers the true median
        at least 95 % of the time (the bound is exact-or-conservative)."""
        rng = np.random.default_rng(1)
        truth = math.log(2.0)
        low_ok = high_ok = 0
        for _ in range(2000):
            lower, upper = order_statistic_bounds(list(rng.exponential(size=60)), 0.5, 0.95)
            assert lower is not None and upper is not None
            low_ok += lower <= truth
            high_ok += upper >= truth
        assert low_ok / 2000 >= 0.94
        assert high_ok / 2000 >= 0.94


class TestPairedBootstrap:
    def test_fast_quantiles_equal_numpy(self) -> None:
        """The counting shortcut gives numpy's type-7 quantile for every resample, ties too."""
        rng = np.random.default_rng(0)
        for n in (5, 37, 400):
            values = rng.lognormal(0, 0.3, n)
            values[::7] = values[0]
            index = rng.integers(0, n, size=(300, n))
            for q in (0.01, 0.5, 0.95, 0.99, 0.999):
                expected = np.quantile(values[index], q, axis=1)
                assert np.allclose(bootstrap_quantiles(values, index, q), expected)

    def test_seeded_and_deterministic(self) -> None:
        """The same input and seed give the same bounds; the estimate is the plain ratio."""
        rng = np.random.default_rng(3)
        base = list(rng.lognormal(0, 0.3, 200))
        spec = [v * 0.5 for v in base]
        first = paired_bootstrap_quantile_ratio(
            base, spec, 0.9, confidence=0.95, resamples=500, seed=7
        )
        again = paired_bootstrap_quantile_ratio(
            base, spec, 0.9, confidence=0.95, resamples=500, seed=7
        )
        assert first == again
        assert first == pytest.approx((0.5, 0.5, 0.5))

    def test_coverage_near_nominal(self) -> None:
        """Paired lognormal arms with a true P90 ratio of 1.3: over 150 seeded windows of
        400 pairs each one-sided bound covers the truth in roughly 95 % of windows."""
        rng = np.random.default_rng(11)
        truth = 1.3
        low_ok = high_ok = 0
        runs = 150
        for run in range(runs):
            shared = rng.normal(size=400)
            base = np.exp(0.3 * shared + 0.2 * rng.normal(size=400))
            spec = truth * np.exp(0.3 * shared + 0.2 * rng.normal(size=400))
            _, lower, upper = paired_bootstrap_quantile_ratio(
                list(base), list(spec), 0.9, confidence=0.95, resamples=400, seed=run
            )
            low_ok += lower <= truth
            high_ok += upper >= truth
        assert 0.88 <= low_ok / runs <= 1.0
        assert 0.88 <= high_ok / runs <= 1.0


class TestMeanOfOne:
    def test_a_single_value_has_no_bound(self) -> None:
        """One value: the mean is that value and both bounds are infinite (never PASS)."""
        assert mean_t_bounds([2.5], 0.9) == (2.5, float("-inf"), float("inf"))
